"""Batch ingestion: the body is one hooks.schema Batch."""

from __future__ import annotations

import logging
from typing import Annotated

import msgspec
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from hyperwatch.monitor.alerting.detectors import detect
from hyperwatch.monitor.alerting.forecast_band import ForecastWatches
from hyperwatch.monitor.alerting.prometheus import ALERTS_RAISED, BATCHES_INGESTED, POINTS_INGESTED
from hyperwatch.monitor.api.batch_body import REQUEST_BODY, ParsedBatch, read_batch
from hyperwatch.monitor.api.deps import SettingsDep, StoreDep, WriteAuth
from hyperwatch.monitor.api.schemas import IngestOut, ProjectName
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.live_notify import news
from hyperwatch.monitor.store.base import Detector, Store, WindowReader
from hyperwatch.monitor.store.entities import GroupThresholds, IngestResult, NewAlert
from hyperwatch.monitor.store.names import MAX_NAMES_PER_BATCH, check_name_count
from hyperwatch.monitor.store.points import last_per_key
from hyperwatch.monitor.thresholds.learned import effective_thresholds

log = logging.getLogger(__name__)
router = APIRouter(tags=["points"])
_STORED, _DUPLICATE = BATCHES_INGESTED.labels("stored"), BATCHES_INGESTED.labels("duplicate")
_ENCODE = msgspec.json.encode

INGEST_DOC = f"""Store one batch of points (the hooks wire format).

- `run` is a run **name** in the project named by `?project=` (default `default`); the run must
  exist (404 otherwise: create it with `POST /api/v1/runs`).
- Idempotent: a `batch_id` already stored for the run is not written again (200, `duplicate:
  true`); a new batch answers 201 (ids are per run: the same id for another run is a new batch).
  A point's key is (run, name, layer, step): sending a key again overwrites its
  value and tokens (**last write wins**); within a batch the last occurrence wins.
- Values: JSON numbers, or the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, stored as such. A
  number beyond the double range (`1e400`, or an integer such as `10**400`) is +-Infinity, as
  IEEE-754 rounding and JavaScript's `JSON.parse` make it, on both databases.
- Alerts: the detectors run in the batch's own transaction; its alert events commit with its
  points (a batch is never stored without them).
- Body: JSON (`Content-Type: application/json`), or the same batch as binary columns
  (`application/vnd.hyperwatch.columns`, layout in `hyperwatch.hooks.columns`, what the hooks' HTTP
  sink sends); any other Content-Type is a 415.
- Limits: body size (413, `HYPERWATCH_MAX_BODY_BYTES`), points per batch (422,
  `HYPERWATCH_MAX_POINTS_PER_BATCH`, at most hooks.schema.MAX_POINTS_PER_BATCH), distinct metric
  names per batch (422, {MAX_NAMES_PER_BATCH}, checked before any database work; a columnar
  header's names that no point uses are not registered); every invalid field is a 422 naming it.
- Cardinality (409, the batch refused whole, nothing stored): distinct (name, layer) series per run
  (`HYPERWATCH_MAX_SERIES_PER_RUN`), per project (`HYPERWATCH_MAX_SERIES_PER_PROJECT`) and metric
  names in the database (`HYPERWATCH_MAX_METRIC_NAMES`); the message names the limit, the count and
  the setting. A batch using only series the run has is always within them.
- The service's detectors run on the new points; the reply counts the alert events raised. A run
  at its group's largest size is also checked against the band its smaller runs forecast for it
  (`forecast_band`, see `GET /api/v1/runs/{{run_id}}/forecast`).
"""


@router.post(
    "/points",
    response_model=IngestOut,
    status_code=201,
    dependencies=[WriteAuth],
    summary="Ingest a batch of metric points",
    description=INGEST_DOC,
    responses={
        200: {"model": IngestOut, "description": "duplicate batch_id: nothing written"},
        404: {"description": "unknown run"},
        413: {"description": "body too large"},
        415: {"description": "a Content-Type other than JSON or the columns body"},
        409: {"description": "the batch would take its run, project or the database past a cardinality limit"},
        422: {"description": "invalid field (named in the message), too many points or too many names"},
        507: {"description": "every metric-name id is in use: a new name cannot be stored (the request is valid)"},
    },
    openapi_extra=REQUEST_BODY,
)
async def ingest(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    project: Annotated[ProjectName, Query(description="project of the run named in the batch")] = "default",
) -> Response:
    # Read and validated here, on the event loop (as FastAPI reads a declared body), into columns;
    # then the database work takes one trip to the threadpool (py-spy: each trip costs a GIL
    # handover and, on a busy machine, a wait to be scheduled; issue 16).
    batch = read_batch(await request.body(), request.headers.get("content-type"))
    if len(batch.points) > settings.max_points_per_batch:
        raise InvalidInputError(
            f"points: the batch has {len(batch.points)} points; the limit is {settings.max_points_per_batch} "
            "(HYPERWATCH_MAX_POINTS_PER_BATCH): split it into smaller batches"
        )
    check_name_count(len(batch.points.names))  # before any database work: a refused batch allocates nothing
    watches: ForecastWatches = request.app.state.forecast_watches
    run_id, result = await run_in_threadpool(_store_batch, store, project, batch, watches)
    (_DUPLICATE if result.duplicate else _STORED).inc()
    if not result.duplicate:
        news.bump(run_id, len(result.alerts))  # committed: wake the live pages waiting on it (sets events)
        POINTS_INGESTED.inc(result.accepted)
        for alert in result.alerts:
            ALERTS_RAISED.labels(alert.rule).inc()
            log.info("alert %s on %s/%s: %s", alert.rule, project, batch.run, alert.message)
    # IngestOut's fields, written directly (a model instance and its dump cost more than the rest of
    # the reply); tests/monitor/store/test_ingest.py checks the reply against the documented model
    out = {"accepted": result.accepted, "duplicate": result.duplicate, "run_id": run_id, "alerts": len(result.alerts)}
    # the run's forecast band is (re)read after the reply: the next batches are checked against it
    later = BackgroundTask(watches.refresh, store, run_id) if watches.due(run_id) else None
    status = 200 if result.duplicate else 201
    return Response(_ENCODE(out), status_code=status, media_type="application/json", background=later)


def _store_batch(store: Store, project: str, batch: ParsedBatch, watches: ForecastWatches) -> tuple[int, IngestResult]:
    points = last_per_key(batch.points)  # the detectors judge what is stored: a key's last value only

    def detector_for(run_id: int, group: GroupThresholds | None) -> Detector:
        forecast = watches.detector(run_id, points)
        thresholds = effective_thresholds(group)  # overrides > learned > defaults, as /metrics exports them

        def detector(reader: WindowReader) -> list[NewAlert]:
            alerts = detect(reader, run_id, points, thresholds)
            return alerts if forecast is None else [*alerts, *forecast(reader)]

        return detector

    # one transaction finds the run and stores the batch; the detectors run inside it: points and
    # alerts commit together, so a batch retried after a lost race or a crash is never stored
    # without its alerts (issue 14)
    result = store.ingest_named(project, batch.run, batch.batch_id, batch.points, detector_for=detector_for)
    return result.run_id, result
