"""Co-teachers: the owner adds and removes them on the class page; they run the class
(scenes, personas, roster, the wall) but neither archive it nor choose co-teachers.

Every co-teacher URL is tried by the owner, a co-teacher, a teacher of another class,
a student of the class and an anonymous visitor.
"""

from __future__ import annotations

import pytest
from django.http import Http404

from chat.actions import ActionError
from classroom import actions
from classroom.access import ClassAction, can_access_classroom
from classroom.models import Classroom, Enrollment
from tests.classroom.test_access import as_user
from tests.classroom.test_supervision import open_wall
from tests.runhost.helpers import adb

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(make_user, default_agent):
    owner = make_user("tess", teacher=True)
    cora = make_user("cora", teacher=True)
    cora.email = "cora@school.example"
    cora.save()
    other_teacher = make_user("otto", teacher=True)
    student = make_user("sam")
    room = actions.create_classroom(owner, title="Algebra", model="demo-fast")
    scene = actions.save_scene(owner, room.pk, title="Equations", content="x")
    actions.join_classroom(student, room.join_code)
    actions.open_class_chat(student, room.pk)
    return {
        "owner": owner,
        "cora": cora,
        "other_teacher": other_teacher,
        "student": student,
        "room": room,
        "scene": scene,
    }


def co_teachers_of(room) -> list[str]:
    return sorted(Classroom.objects.get(pk=room.pk).co_teachers.values_list("username", flat=True))


# --- the rules -------------------------------------------------------------------------------------


def test_the_rules_of_class_access(world, make_user):
    room = world["room"]
    actions.add_co_teacher(world["owner"], room.pk, "cora")
    room = Classroom.objects.get(pk=room.pk)
    expected = {
        "owner": {ClassAction.STUDY, ClassAction.TEACH, ClassAction.OWN},
        "cora": {ClassAction.STUDY, ClassAction.TEACH},
        "student": {ClassAction.STUDY},
        "other_teacher": set(),
    }
    for who, allowed in expected.items():
        got = {a for a in ClassAction if can_access_classroom(world[who], room, a)}
        assert got == allowed, who
    from django.contrib.auth.models import AnonymousUser

    assert not any(can_access_classroom(AnonymousUser(), room, a) for a in ClassAction)


# --- every co-teacher URL, by everyone ---------------------------------------------------------------


def test_the_owner_adds_and_removes_a_co_teacher(world):
    owner, room, cora = as_user(world["owner"]), world["room"], world["cora"]
    response = owner.post(f"/classes/{room.pk}/co-teachers/add/", {"who": "cora"})
    assert response.status_code == 302
    assert response["Location"] == f"/classes/{room.pk}/#co-teachers"
    assert co_teachers_of(room) == ["cora"]
    page = owner.get(f"/classes/{room.pk}/").content.decode()
    assert "cora now co-teaches this class." in page
    assert 'aria-label="Co-teachers"' in page and "Remove co-teacher cora" in page
    response = owner.post(f"/classes/{room.pk}/co-teachers/{cora.pk}/remove/", follow=True)
    assert "cora no longer co-teaches this class." in response.content.decode()
    assert co_teachers_of(room) == []


@pytest.mark.parametrize("who", ["cora", "other_teacher", "student", None])
def test_nobody_but_the_owner_manages_co_teachers(world, make_user, who):
    room = world["room"]
    actions.add_co_teacher(world["owner"], room.pk, "cora")
    ida = make_user("ida", teacher=True)
    client = as_user(world[who] if who else None)
    urls = [
        (f"/classes/{room.pk}/co-teachers/add/", {"who": "ida"}),
        (f"/classes/{room.pk}/co-teachers/{world['cora'].pk}/remove/", {}),
        (f"/classes/{room.pk}/co-teachers/{ida.pk}/remove/", {}),
    ]
    for url, data in urls:
        response = client.post(url, data)
        if who is None:
            assert response.status_code == 302 and "/login/" in response["Location"], url
        else:
            assert response.status_code == 404, (who, url, response.status_code)
    assert co_teachers_of(room) == ["cora"]


def test_only_post_is_allowed_and_removing_a_stranger_is_a_404(world):
    owner, room = as_user(world["owner"]), world["room"]
    assert owner.get(f"/classes/{room.pk}/co-teachers/add/").status_code == 405
    # Otto co-teaches nothing here: there is no such co-teacher to remove.
    url = f"/classes/{room.pk}/co-teachers/{world['other_teacher'].pk}/remove/"
    assert owner.post(url).status_code == 404


# --- what a co-teacher may do --------------------------------------------------------------------


def test_a_co_teacher_runs_the_class(world):
    room, scene = world["room"], world["scene"]
    actions.add_co_teacher(world["owner"], room.pk, "cora@SCHOOL.example")  # by email
    cora = as_user(world["cora"])
    listing = cora.get("/classes/").content.decode()
    assert "Algebra" in listing and "co-teacher with tess" in listing
    page = cora.get(f"/classes/{room.pk}/").content.decode()
    assert "Co-teachers" in page and "cora" in page
    # They see who co-teaches, but manage neither co-teachers nor the archive.
    assert "Add co-teacher" not in page and "Remove co-teacher" not in page
    assert "Archive class" not in page
    for url in (
        f"/classes/{room.pk}/scenes/new/",
        f"/classes/{room.pk}/scenes/{scene.pk}/",
        f"/classes/{room.pk}/personas/new/",
        f"/classes/{room.pk}/live/",
        f"/classes/{room.pk}/chat/",
        f"/classes/{room.pk}/export.zip",
    ):
        assert cora.get(url).status_code == 200, url
    cora.post(f"/classes/{room.pk}/scenes/new/", {"title": "Graphs", "kind": "lecture"})
    graphs = room.scenes.get(title="Graphs")
    cora.post(f"/classes/{room.pk}/scenes/{graphs.pk}/current/")
    assert Classroom.objects.get(pk=room.pk).current_scene_id == graphs.pk
    maya = room.personas.get(name="Maya")
    cora.post(f"/classes/{room.pk}/personas/{maya.pk}/", {"name": "Mira", "role": "student"})
    assert room.personas.filter(name="Mira").exists()
    old_code = room.join_code
    cora.post(f"/classes/{room.pk}/code/")
    assert Classroom.objects.get(pk=room.pk).join_code != old_code
    enrollment = Enrollment.objects.get(classroom=room)
    cora.post(f"/classes/{room.pk}/roster/{enrollment.pk}/remove/")
    assert not Enrollment.objects.filter(classroom=room).exists()
    # Not theirs: archiving the class.
    assert cora.post(f"/classes/{room.pk}/archive/", {"archive": "1"}).status_code == 404
    assert Classroom.objects.get(pk=room.pk).archived_at is None
    with pytest.raises(Http404):
        actions.set_archived(world["cora"], room.pk, True)
    assert (
        as_user(world["owner"]).post(f"/classes/{room.pk}/archive/", {"archive": "1"}).status_code
        == 302
    )
    assert Classroom.objects.get(pk=room.pk).archived_at is not None


async def test_a_co_teacher_opens_the_wall_socket_until_removed(world):
    room = world["room"]
    await adb(actions.add_co_teacher)(world["owner"], room.pk, "cora")
    comm, ok, _code = await open_wall(world["cora"], room.pk)
    assert ok
    await comm.send_json_to({"action": "resync", "seqs": {}})
    await adb(actions.remove_co_teacher)(world["owner"], room.pk, world["cora"].pk)
    output = await comm.receive_output(timeout=5)
    while output["type"] != "websocket.close":
        output = await comm.receive_output(timeout=5)
    assert output["code"] == 4403
    _comm, ok, _code = await open_wall(world["cora"], room.pk)
    assert not ok


def test_a_removed_co_teacher_loses_the_class(world):
    room = world["room"]
    actions.add_co_teacher(world["owner"], room.pk, "cora")
    actions.remove_co_teacher(world["owner"], room.pk, world["cora"].pk)
    cora = as_user(world["cora"])
    assert "Algebra" not in cora.get("/classes/").content.decode()
    assert cora.get(f"/classes/{room.pk}/").status_code == 404
    assert cora.get(f"/classes/{room.pk}/live/").status_code == 404


# --- validation ------------------------------------------------------------------------------------


def test_who_can_be_added_and_the_messages(world, make_user):
    owner, room = world["owner"], world["room"]

    def refused(who: str) -> str:
        with pytest.raises(ActionError) as caught:
            actions.add_co_teacher(owner, room.pk, who)
        return caught.value.message

    assert refused("  ") == "Type the username or email of a teacher."
    # An unknown name and a student get the same answer: nothing says who has an account.
    assert refused("nobody") == "No teacher has the username or email “nobody”."
    assert refused("sam") == "No teacher has the username or email “sam”."
    assert refused("tess") == "You own this class already."
    tom = make_user("tom", teacher=True)
    Enrollment.objects.create(classroom=room, student=tom)
    assert refused("tom") == "tom is a student of this class: remove them from the roster first."
    actions.add_co_teacher(owner, room.pk, "CORA")
    actions.add_co_teacher(owner, room.pk, "cora")  # twice: harmless
    assert co_teachers_of(room) == ["cora"]
    response = as_user(owner).post(
        f"/classes/{room.pk}/co-teachers/add/", {"who": "nobody"}, follow=True
    )
    assert "No teacher has the username or email “nobody”." in response.content.decode()


def test_a_co_teacher_using_the_join_code_stays_a_teacher(world):
    room = world["room"]
    actions.add_co_teacher(world["owner"], room.pk, "cora")
    assert actions.join_classroom(world["cora"], room.join_code).pk == room.pk
    assert not Enrollment.objects.filter(classroom=room, student=world["cora"]).exists()
