from django.urls import path

from debugger import views

app_name = "debugger"
urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
]
