from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.urls import include, path, re_path
from django.views.i18n import set_language

from chat.api.views import not_found as api_not_found
from chat.relay.pages import usage_page
from chat.signin import ThrottledAdminAuthenticationForm, ThrottledLoginView

# The admin's sign-in counts attempts like the login page's (chat/throttle.py).
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password/change/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "password/change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    # The header's language picker posts here; the login page has it too.
    path("i18n/setlang/", login_not_required(set_language), name="set_language"),
    path("admin/", admin.site.urls),
    path("api/v1/classrooms/", include("classroom.api_urls")),
    path("api/v1/relay/", include("chat.relay.urls")),
    path("usage/", usage_page, name="usage"),
    path("api/v1/", include("chat.api.urls")),
    path("classes/", include("classroom.urls")),
    re_path(r"^api(?:/|$)", api_not_found),  # other API versions and paths: JSON, not HTML
    path("", include("chat.urls")),
]
