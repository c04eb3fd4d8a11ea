// The control fields as the service states them (GET api/control/rules): the form's fields,
// their hints and the checks made before a request is sent. The page states no rule of its
// own: a rule changed in the service changes them all.

// "min_scale" -> "Min scale".
export function fieldLabel(name) {
  const text = name.replaceAll("_", " ");
  return text.charAt(0).toUpperCase() + text.slice(1);
}

// The served rules as the form's fields, in the order a request takes them.
export function controlFields(rules) {
  return rules.fields.map((field) => ({
    name: field.name,
    label: fieldLabel(field.name),
    integer: field.integer,
    hint: `${field.purpose.charAt(0).toUpperCase()}${field.purpose.slice(1)}: ${field.requirement}`,
    rule: field.rule,
    bounds: field.bounds,
  }));
}

// null when a finite `number` keeps the field's bounds (JSON Schema's), else the message
// the service answers such a value with.
export function ruleProblem(field, number) {
  const { minimum, maximum, exclusiveMinimum, exclusiveMaximum } = field.bounds;
  const keeps =
    (minimum === undefined || number >= minimum) &&
    (maximum === undefined || number <= maximum) &&
    (exclusiveMinimum === undefined || number > exclusiveMinimum) &&
    (exclusiveMaximum === undefined || number < exclusiveMaximum);
  return keeps ? null : field.rule;
}
