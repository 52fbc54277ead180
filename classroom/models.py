"""Classrooms, scenes and personas arrive in a later issue; chat never imports this app."""
