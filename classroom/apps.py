from django.apps import AppConfig


class ClassroomConfig(AppConfig):
    name = "classroom"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Classroom plugs into chat through its seams; chat never imports classroom.
        from chat.access import (
            register_chat_policy,
            register_owner_limit,
            register_view_observer,
        )
        from chat.actions import register_send_check
        from chat.models import ChatSession
        from chat.panels import register_home_panel
        from chat.presentation.fragments import register_event_fragment
        from chat.runhost.setup import register_run_finished, register_run_setup
        from classroom.access import student_limit, teacher_policy
        from classroom.actions import class_run_finished, class_send_check, observe_view
        from classroom.panels import scene_marker_fragments
        from classroom.prompt import class_run_setup
        from classroom.views import home_panel

        register_chat_policy(teacher_policy)
        register_owner_limit(ChatSession.Kind.CLASSROOM, student_limit)
        register_send_check(ChatSession.Kind.CLASSROOM, class_send_check)
        register_run_finished(ChatSession.Kind.CLASSROOM, class_run_finished)
        register_run_setup(ChatSession.Kind.CLASSROOM, class_run_setup)
        register_home_panel(home_panel)
        register_view_observer(observe_view)
        register_event_fragment("scene", scene_marker_fragments)
