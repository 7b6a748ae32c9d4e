"""The web catalog: read-only pages and a JSON API over a Zoo (`zoo serve`), and the same pages as
static files (`zoo catalog`).

views: what every page and API answer holds, as JSON-ready dicts built from Zoo methods only.
app: the HTTP server (Starlette): routes, typed errors as JSON, security headers.
export: the static catalog: HTML shells, JSON data and the assets, searched in the page by static/grammar.js.
static/: the scripts (vanilla ES modules, the plot drawn as SVG) and the style; templates/: the two HTML shells.
"""
