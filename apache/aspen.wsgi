# Loaded by mod_wsgi (WSGIScriptAlias in aspen-wsgi.conf). Aspen reads its
# settings (GIT_PROJECT_ROOT, GIT_HTTP_EXPORT_ALL, ...) from Apache's SetEnv
# lines, which mod_wsgi passes in each request's environ.
from aspen_cgi.wsgi import application  # noqa: F401
