from agentrun.api.operations import api

# Generated from the operations declared in agentrun.api.operations (Ninja's API root excluded).
app_name = "api"
urlpatterns = api.url_patterns()
