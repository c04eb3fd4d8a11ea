import { test } from "node:test";
import assert from "node:assert/strict";

import { canWrite, identityLabel } from "../who.js";

test("only an operator or an admin may change a run; an anonymous reader is asked for a token", () => {
  assert.equal(canWrite({ name: "vera", role: "viewer" }), false);
  assert.equal(canWrite({ name: "olga", role: "operator" }), true);
  assert.equal(canWrite({ name: "admin", role: "admin" }), true);
  assert.equal(canWrite({ name: null, role: null }), true); // the form asks for a token
});

test("the header names the identity, or says nobody signed in", () => {
  assert.equal(identityLabel({ name: "olga", role: "operator" }), "olga · operator");
  assert.equal(identityLabel({ name: null, role: null }), "anonymous · read-only");
});
