from chat.roles import role_of


def roles(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"user_role": role_of(user)}
