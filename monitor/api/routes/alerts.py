"""Alert events raised by the service's detectors."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep
from hyperwatch.monitor.schemas import AlertOut

router = APIRouter(tags=["alerts"], dependencies=[ReadAuth])


@router.get("/alerts", response_model=list[AlertOut], summary="Alert events, newest first")
def list_alerts(
    store: StoreDep,
    settings: SettingsDep,
    run_id: int | None = None,
    project: str | None = None,
    group_id: int | None = None,
    rule: Annotated[str | None, Query(description="z_spike, nan_loss, nonfinite_value, max_vio_collapse")] = None,
    limit: Annotated[int, Query(ge=1)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[AlertOut]:
    found = store.list_alerts(run_id, project, group_id, rule, min(limit, settings.max_page_size), offset)
    return [AlertOut.model_validate(a) for a in found]
