"""Groups (sweeps): runs compared across scales, with per-group detector thresholds."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from pydantic import ValidationError

from hyperwatch.monitor.api.deps import ReadAuth, StoreDep, WriteAuth
from hyperwatch.monitor.schemas import GroupCreate, GroupFields, GroupOut

router = APIRouter(tags=["groups"])
log = logging.getLogger(__name__)


def _fields(body: GroupFields) -> dict[str, object]:
    fields = body.model_dump(exclude_unset=True, exclude={"name", "project"})
    if body.thresholds is not None:
        fields["thresholds"] = body.thresholds.model_dump(exclude_none=True)
    return fields


@router.post(
    "/groups",
    response_model=GroupOut,
    status_code=201,
    dependencies=[WriteAuth],
    responses={200: {"model": GroupOut, "description": "an existing group, updated"}},
    summary="Create a group, or update the group with this project and name",
)
def upsert_group(body: GroupCreate, store: StoreDep, response: Response) -> GroupOut:
    group, created = store.upsert_group(body.project, body.name, _fields(body))
    response.status_code = 201 if created else 200
    return GroupOut.model_validate(group)


@router.get("/groups", response_model=list[GroupOut], dependencies=[ReadAuth], summary="List groups")
def list_groups(store: StoreDep, project: str | None = None) -> list[GroupOut]:
    out = []
    for group in store.list_groups(project):
        try:
            out.append(GroupOut.model_validate(group))
        except ValidationError as exc:  # one bad row never fails the list (see monitor.store.repair)
            log.warning("group id %s cannot be sent (%s); left out of the list", group.id, exc)
    return out


@router.get("/groups/{group_id}", response_model=GroupOut, dependencies=[ReadAuth], summary="One group")
def get_group(group_id: int, store: StoreDep) -> GroupOut:
    return GroupOut.model_validate(store.get_group(group_id))


@router.patch("/groups/{group_id}", response_model=GroupOut, dependencies=[WriteAuth], summary="Update a group")
def update_group(group_id: int, body: GroupFields, store: StoreDep) -> GroupOut:
    return GroupOut.model_validate(store.update_group(group_id, _fields(body)))
