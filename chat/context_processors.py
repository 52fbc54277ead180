from django.utils.translation import gettext

from chat.roles import ROLE_LABELS, role_of


def roles(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    role = role_of(user)
    return {"user_role": role, "user_role_label": ROLE_LABELS.get(role, role)}


def languages(request):
    """Texts the page's scripts show, in the page's language (read from ``#lyceum-texts``):
    static files cannot be translated, the page they run on can."""
    return {"js_texts": js_texts()}


def js_texts() -> dict[str, str]:
    return {
        "copy": gettext("Copy"),
        "copied": gettext("Copied"),
        "copyCode": gettext("Copy code"),
        "copyMessage": gettext("Copy message"),
        "remove": gettext("Remove"),
        "removeFile": gettext("Remove %(name)s"),
        "uploadFailed": gettext("The upload failed."),
        "couldNotUpload": gettext("Could not upload %(name)s."),
        "reconnectingPending": gettext(
            "Reconnecting… Your message is kept and goes out when the connection is back."
        ),
        "reconnecting": gettext(
            "Reconnecting… What you type is kept; a message sent now goes out when the "
            "connection is back."
        ),
        "refused": gettext(
            "Disconnected: this chat is no longer available to you. Reload the page."
        ),
        "unreadNew": gettext("%(count)s new"),
    }
