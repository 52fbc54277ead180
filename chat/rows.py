"""Model rows read and written by written-out statements, converted as the ORM converts them.

A burst of sends queues on the process's one database thread, and there building a
query through the ORM (compiling its filters, joins and select list) cost more than
running it: about 1 ms a statement on a run's start. The hottest fixed statements of
a send and a run's claim are written out, and these helpers give them what the ORM
would: the quoted column list of a model's fields, and the row turned back into a
model instance (``Model.from_db``) with each value passed through the same
converters the ORM applies (the backend's, then the field's own ``from_db_value``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model

Converter = Callable[[Any, Any, Any], Any]

# (model, field names, vendor) -> [(field, its converters)]: the same for every row.
_converters: dict[tuple[type[Model], tuple[str, ...], str], list[tuple[Any, list[Converter]]]] = {}


def fields_of(model: type[Model]) -> tuple[str, ...]:
    """The attribute names of the model's concrete fields, in ``Model.from_db``'s order."""
    return tuple(f.attname for f in model._meta.concrete_fields)


# The quoted names, kept per database vendor (its quoting): built at every call, a run's
# statements spent more on them (each ``connection`` a context-local lookup) than on
# running the statements (bench/README.md, eighth round).
_quoted: dict[tuple[Any, ...], str] = {}


def column(model: type[Model], name: str) -> str:
    """The quoted column of field ``name`` (a field name or its attname)."""
    key = (model, name, connection.vendor)
    quoted = _quoted.get(key)
    if quoted is None:
        quoted = _quoted[key] = connection.ops.quote_name(str(_field(model, name).column))
    return quoted


def table(model: type[Model]) -> str:
    key = (model, connection.vendor)
    quoted = _quoted.get(key)
    if quoted is None:
        quoted = _quoted[key] = connection.ops.quote_name(model._meta.db_table)
    return quoted


def select_list(model: type[Model], alias: str, names: Sequence[str] | None = None) -> str:
    """``alias."col", …`` for ``names`` (every concrete field by default)."""
    key = (model, alias, None if names is None else tuple(names), connection.vendor)
    found = _quoted.get(key)
    if found is None:
        quote = connection.ops.quote_name
        listed = fields_of(model) if names is None else names
        found = _quoted[key] = ", ".join(f"{quote(alias)}.{column(model, n)}" for n in listed)
    return found


def convert(model: type[Model], names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """The row's values as the ORM would give them (UUIDs, datetimes, booleans, JSON)."""
    key = (model, tuple(names), connection.vendor)
    plan = _converters.get(key)
    if plan is None:
        plan = []
        for name in names:
            field = _field(model, name)
            col = field.get_col(model._meta.db_table)
            plan.append(
                (col, connection.ops.get_db_converters(col) + col.get_db_converters(connection))
            )
        _converters[key] = plan
    out = []
    for (col, converters), value in zip(plan, values, strict=True):
        for converter in converters:
            value = converter(value, col, connection)
        out.append(value)
    return out


def instance(model: type[Model], values: Sequence[Any]) -> Any:
    """A model instance from a row of :func:`select_list` (every concrete field), as a
    query would have made it."""
    names = fields_of(model)
    return model.from_db(connection.alias, list(names), convert(model, names, values))


def create(model: type[Model], /, **values: Any) -> Any:
    """``model.objects.create(**values)`` in one written-out ``INSERT … RETURNING``: the
    same defaults, ``auto_now_add`` and value preparation, without the ORM's building of
    the statement. It sends no ``pre_save``/``post_save`` signals: only for models nothing
    listens to (a run, a message's input)."""
    obj = model(**values)
    opts = model._meta
    pk = opts.pk
    assert pk is not None
    auto_pk = getattr(pk, "db_returning", False) and obj.pk is None
    fields = [f for f in opts.concrete_fields if not (auto_pk and f is pk)]
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {table(model)} ({', '.join(quote(str(f.column)) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if auto_pk:
        sql += f" RETURNING {quote(str(pk.column))}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if auto_pk:
            (obj.pk,) = convert(model, [pk.attname], cursor.fetchone())
    obj._state.adding = False
    obj._state.db = connection.alias
    return obj


def update(
    model: type[Model],
    pk: Any,
    /,
    _where_in: tuple[str, Sequence[Any]] | None = None,
    **changes: Any,
) -> int:
    """``model.objects.filter(pk=pk).update(**changes)`` (plain values, no expressions) in
    one written-out statement; the rows changed. ``_where_in=(name, values)`` adds
    ``name__in=values`` to the filter (a run's end updates only a live run)."""
    quote = connection.ops.quote_name
    fields = [_field(model, name) for name in changes]
    sets = ", ".join(f"{quote(str(f.column))} = %s" for f in fields)
    params = [
        f.get_db_prep_save(value, connection)
        for f, value in zip(fields, changes.values(), strict=True)
    ]
    where = f"{column(model, 'pk')} = %s"
    params.append(prep(model, "pk", pk))
    if _where_in is not None:
        name, values = _where_in
        where += f" AND {column(model, name)} IN ({', '.join(['%s'] * len(values))})"
        params += [prep(model, name, value) for value in values]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table(model)} SET {sets} WHERE {where}", params)
        return cursor.rowcount


def prep(model: type[Model], name: str, value: Any) -> Any:
    """``value`` as a parameter for field ``name`` (as a filter or a save would pass it)."""
    return _field(model, name).get_db_prep_save(value, connection)


def _field(model: type[Model], name: str) -> Field:
    opts = model._meta
    if name == "pk":
        return opts.pk  # type: ignore[return-value]
    try:
        return opts.get_field(name)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - an attname ("chat_id"), not a field name
        for field in opts.concrete_fields:
            if field.attname == name:
                return field  # type: ignore[return-value]
        raise
