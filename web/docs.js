// Starts Swagger UI on /docs. A file of its own: the pages' Content-Security-Policy runs
// no inline script.
const root = document.getElementById("swagger-ui");
const bundle = window.SwaggerUIBundle;
bundle({
  url: root.dataset.openapiUrl,
  domNode: root,
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [bundle.presets.apis, bundle.SwaggerUIStandalonePreset],
});
