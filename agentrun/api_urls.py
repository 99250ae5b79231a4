from agentrun.api import api

# Generated from the operations declared in agentrun.api (Ninja's API root excluded).
app_name = "api"
urlpatterns = api.url_patterns()
