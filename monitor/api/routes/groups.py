"""Groups (sweeps): runs compared across scales, with per-group detector thresholds (overridden or learned)."""

from __future__ import annotations

import logging
from dataclasses import asdict

from fastapi import APIRouter, Response
from pydantic import ValidationError

from hyperwatch.monitor.api.deps import ReadAuth, StoreDep, WriteAuth
from hyperwatch.monitor.api.schemas import GroupCreate, GroupFields, GroupOut, ThresholdOut
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Group
from hyperwatch.monitor.thresholds import learned

router = APIRouter(tags=["groups"])
log = logging.getLogger(__name__)


THRESHOLDS_DOC = """Every detector threshold of the group (the keys of `monitor/thresholds/defaults.py`
`DEFAULT_THRESHOLDS`) with the value the service's detectors and the exported Prometheus gauges use,
and where it came from:

- `override`: set on the group (`PATCH /api/v1/groups/{id}` with `thresholds`); beats the others;
- `learned`: the group learns (`learn_thresholds` true, or unset: learning is on by default) and its
  finished healthy runs (status `finished`, a finite last loss, no incident of a rule that reads the
  loss or its gradients, and a final loss within `learn_loss_margin` of the group's best) put it
  above the default: `learn_multiple` x the highest peak of its metric over those runs, once
  there are `learn_min_runs` of them (growth floors and `attention_lse_max_limit` only; `detail`
  names the peak, its run and the runs learned from);
- `default`: the service's default (`detail` says why nothing was learned, where learning applies).
"""


def _fields(body: GroupFields) -> dict[str, object]:
    fields = body.model_dump(exclude_unset=True, exclude={"name", "project"})
    if body.thresholds is not None:
        fields["thresholds"] = body.thresholds.model_dump(exclude_none=True)
    return fields


def _relearn(store: Store, group: Group, fields: dict[str, object]) -> Group:
    """A group whose learning setting was sent reads its runs again (learning on: at once)."""
    if "learn_thresholds" not in fields:
        return group
    learned.refresh_quietly(store, [group.id])
    return store.get_group(group.id)


@router.post(
    "/groups",
    response_model=GroupOut,
    status_code=201,
    dependencies=[WriteAuth],
    responses={200: {"model": GroupOut, "description": "an existing group, updated"}},
    summary="Create a group, or update the group with this project and name",
)
def upsert_group(body: GroupCreate, store: StoreDep, response: Response) -> GroupOut:
    fields = _fields(body)
    group, created = store.upsert_group(body.project, body.name, fields)
    response.status_code = 201 if created else 200
    return GroupOut.model_validate(_relearn(store, group, fields))


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
    fields = _fields(body)
    return GroupOut.model_validate(_relearn(store, store.update_group(group_id, fields), fields))


@router.get(
    "/groups/{group_id}/thresholds",
    response_model=list[ThresholdOut],
    dependencies=[ReadAuth],
    summary="A group's thresholds in force, each with where it came from (default, override or learned)",
    description=THRESHOLDS_DOC,
    responses={404: {"description": "unknown group"}},
)
def group_thresholds(group_id: int, store: StoreDep) -> list[ThresholdOut]:
    return [ThresholdOut.model_validate(asdict(t)) for t in learned.provenance(store.get_group(group_id), group_id)]
