from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from agentrun.telemetry.views import metrics

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("agentrun.api.urls")),
    path("metrics", metrics, name="metrics"),
    path("", include("debugger.urls")),
]

# A database that is down answers 503 even where a middleware met it (agentrun/infra/outage.py).
handler500 = "agentrun.infra.outage.server_error"
