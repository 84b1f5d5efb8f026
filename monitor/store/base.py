"""The store interface: everything the API, detectors and /metrics need from the database.

One implementation today (:class:`monitor.store.sql.SqlStore`, SQLite or PostgreSQL). Methods
raise :mod:`monitor.core.errors` exceptions, never database-driver ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store.cardinality import SeriesLimits
from hyperwatch.monitor.store.entities import (
    ActiveRun,
    Alert,
    Group,
    GroupThresholds,
    IngestResult,
    LatestValue,
    LayerMatrix,
    NewAlert,
    Run,
    RunHealth,
    Series,
    SeriesInfo,
    SeriesSummary,
)

if TYPE_CHECKING:
    from hyperwatch.monitor.store.incidents import Incident
    from hyperwatch.monitor.store.outbox import Outbox
    from hyperwatch.monitor.store.webhooks import Webhook


class WindowReader(Protocol):
    """The reads a detector needs: trailing windows of many series (a Store, or one open transaction);
    ``trailing_points`` gives each value with its step (the forecast alert aligns layers by step)."""

    def trailing_windows(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[float]]: ...

    def trailing_points(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]: ...


Detector = Callable[[WindowReader], Sequence[NewAlert]]
DetectorFor = Callable[[int, GroupThresholds | None], Detector | None]
"""The detector of a batch, given its run's id and its group's threshold settings (None: no group)."""
"""What :meth:`Store.ingest` runs on a new batch inside its transaction (see monitor.alerting.detectors)."""


class Store(ABC):
    series_limits: SeriesLimits = SeriesLimits()
    """What a batch may add (monitor.store.cardinality); ``create_app`` sets the service's settings."""

    # schema and health
    @abstractmethod
    def ping(self) -> None:
        """Raise StoreUnavailableError unless the database answers."""

    @abstractmethod
    def check_schema(self) -> None:
        """Raise SchemaOutOfDateError unless the schema is at the code's head revision."""

    @abstractmethod
    def close(self) -> None: ...

    # runs and groups
    @abstractmethod
    def upsert_run(self, project: str, name: str, fields: dict[str, Any]) -> tuple[Run, bool]:
        """Create the run or update the given fields; returns (run, created)."""

    @abstractmethod
    def update_run(self, run_id: int, fields: dict[str, Any]) -> Run: ...

    @abstractmethod
    def get_run(self, run_id: int) -> Run: ...

    @abstractmethod
    def find_run(self, project: str, name: str) -> Run: ...

    @abstractmethod
    def list_runs(
        self,
        project: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        archived: bool | None = False,
    ) -> list[Run]:
        """Runs by id; ``archived``: False (the default) leaves archived runs out, True lists them only, None all."""

    @abstractmethod
    def delete_run(self, run_id: int) -> tuple[str, str, int]:
        """Delete the run and every row it owns (points, chunks, rollups, series, batches, alerts, incidents,
        tags) in one transaction, its project's series count kept; returns its (project, name, series)."""

    @abstractmethod
    def upsert_group(self, project: str, name: str, fields: dict[str, Any]) -> tuple[Group, bool]: ...

    @abstractmethod
    def update_group(self, group_id: int, fields: dict[str, Any]) -> Group: ...

    @abstractmethod
    def get_group(self, group_id: int) -> Group: ...

    @abstractmethod
    def list_groups(self, project: str | None = None) -> list[Group]: ...

    # what a group learns its thresholds from (monitor.thresholds.learned; monitor.store.learning)
    @abstractmethod
    def group_run_health(self, group_id: int) -> list[RunHealth]:
        """Each run of the group with its status, last loss, archived flag and kinds of incident, by id."""

    @abstractmethod
    def series_peaks(self, run_ids: Sequence[int], bases: Sequence[str]) -> dict[tuple[int, str], float]:
        """(run id, metric name) -> its highest finite value over every layer and step, for each name
        whose base (``hooks.schema.base_name``) is one of ``bases``, read from the rollups."""

    @abstractmethod
    def save_learned(self, group_id: int, learned: dict[str, Any], read_at: float) -> bool:
        """Store what the group learned, read from its runs at ``read_at`` (Unix time); False, and
        nothing stored, when what it holds was read later (a concurrent refresh's stands)."""

    # points
    @abstractmethod
    def ingest(
        self,
        run_id: int,
        batch_id: str,
        points: Sequence[Point] | PointColumns,
        detector: Detector | None = None,
    ) -> IngestResult:
        """Store a batch once: a repeated batch_id is a no-op; a repeated (name, layer, step) overwrites.

        ``detector`` (given a reader of trailing windows) runs on a new batch inside the same
        transaction and its alerts are stored with the points: both commit, or neither does.
        """

    @abstractmethod
    def ingest_named(
        self,
        project: str,
        run: str,
        batch_id: str,
        points: Sequence[Point] | PointColumns,
        detector_for: DetectorFor | None = None,
    ) -> IngestResult:
        """:meth:`ingest` into the run named ``run`` in ``project`` (NotFoundError if there is none),
        what the ingest route calls; ``detector_for`` builds the detector from the run's id and its
        group's threshold settings (None without a group), both read in the batch's own transaction."""

    @abstractmethod
    def series(
        self, run_id: int, name: str, layer: int | None, buckets: int, start: int | None, end: int | None
    ) -> Series: ...

    @abstractmethod
    def layer_matrix(self, run_id: int, name: str, buckets: int, start: int | None, end: int | None) -> LayerMatrix: ...

    @abstractmethod
    def list_series(
        self, run_id: int, limit: int | None = None, after: tuple[str, int | None] | None = None
    ) -> list[SeriesInfo]:
        """The run's series with their latest point, in (name, layer) order (run level first): at most
        ``limit`` (None: ``series_limits.per_run``), those after ``after`` = (name, layer) when given."""

    @abstractmethod
    def series_summaries(self, run_ids: Sequence[int], names: Sequence[str]) -> dict[tuple[int, str], SeriesSummary]:
        """(run id, name) -> the run-level series ``name`` of that run summed up: its latest step and value
        (NaN kept) and its smallest and largest values with their steps, over every stored step (NaN
        never counts, +-Inf do, the earliest step wins a tie). A pair the run never logged at run
        level is left out. What the runs table's summary columns show (``GET /api/v1/runs?summary=``).

        Contract for the storage format: the extremes are exact (equal to a scan of every point, as
        ``chunks.all_points`` gives them) yet read without touching every point: a page of 100 runs
        reads a few dozen summary rows per series (:mod:`monitor.store.summary` reads the nested rollup
        levels and the hot tail). A change to where points or rollups live must keep this method
        right; ``tests/monitor/api/test_run_summary.py`` checks it against every point on both
        databases, with extremes in every level and the hot tail."""

    @abstractmethod
    def run_heads(self, run_ids: Sequence[int]) -> dict[int, tuple[int | None, str]]:
        """Each run's last step and status (a run not found is left out): what a live page's cursor is
        compared with, in one small read."""

    @abstractmethod
    def newest_points(self, run_id: int, step: int) -> list[tuple[str, int | None, float]] | None:
        """``(name, layer, value)`` of each series' point at ``step`` while ``step`` is still the run's
        last step (``Run.last_step``), in :meth:`list_series` order; None once the run has moved past
        it (read its points another way). What a live page draws for one new step: one primary-key read
        when this process stored the run's last batch, a read of the run's latest values otherwise."""

    def trailing_values(self, run_id: int, name: str, layer: int | None, before_step: int, limit: int) -> list[float]:
        """The ``limit`` newest values strictly before ``before_step``, oldest first."""
        return self.trailing_windows(run_id, [(name, layer, before_step)], limit)[0]

    def trailing_windows(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[float]]:
        """:meth:`trailing_values` of many ``(name, layer, before_step)`` at once (one read), in ``keys`` order."""
        return [[v for _step, v in w] for w in self.trailing_points(run_id, keys, limit)]

    @abstractmethod
    def trailing_points(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]:
        """:meth:`trailing_windows` with each value's step, ``(step, value)`` pairs (aligns layers by step)."""

    @abstractmethod
    def step_maxima(self, run_id: int, keys: Sequence[tuple[str, int]], limit: int) -> list[list[tuple[int, float]]]:
        """Per ``(name, top step)``, in ``keys`` order: ``(step, the max over the name's layers of the finite
        values logged at it)`` for the name's last ``limit`` logged steps up to ``top``, oldest first (a step
        with no finite value is left out): a layered metric's max-over-layers series, counted in logged
        steps (the growth rules' windows on ``/metrics``). Empty for a name the run has no layer of."""

    # alerts and exports
    @abstractmethod
    def add_alerts(self, run_id: int, alerts: Sequence[NewAlert]) -> list[NewAlert]:
        """Store alerts, skipping ones already stored; returns the new ones."""

    @abstractmethod
    def list_alerts(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Alert]: ...

    @abstractmethod
    def list_incidents(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Incident]:
        """Incidents (alert events grouped per run, rule and episode), most recently active first."""

    # notifications (monitor.store.webhooks, .outbox; sent by monitor.alerting.notify)
    @abstractmethod
    def upsert_webhook(self, project: str, url: str, fields: dict[str, Any]) -> tuple[Webhook, bool]:
        """Create the project's webhook of ``url`` (and the project, when new) or update the given fields
        of the one it has; returns (webhook, created). New incidents of the project queue a delivery."""

    @abstractmethod
    def update_webhook(self, project: str, webhook_id: int, fields: dict[str, Any]) -> Webhook: ...

    @abstractmethod
    def list_webhooks(self, project: str) -> list[Webhook]:
        """The project's webhooks by id, each with its deliveries pending, delivered, failed and its latest."""

    @abstractmethod
    def get_webhook(self, project: str, webhook_id: int) -> Webhook: ...

    @abstractmethod
    def delete_webhook(self, project: str, webhook_id: int) -> Webhook:
        """Delete the webhook and its deliveries; returns what it was."""

    @abstractmethod
    def webhook_outbox(self) -> Outbox:
        """The deliveries' outbox on a connection pool of its own (the deliverer's; close it when done)."""

    @abstractmethod
    def latest_for_active_runs(self, names: Sequence[str] | None = None) -> list[LatestValue]:
        """The latest point of each series of the running runs (archived ones left out), of the metrics
        ``names`` only when given."""

    @abstractmethod
    def active_runs(self) -> list[ActiveRun]:
        """The running runs that have points, archived ones left out: their last step, last write and series count."""
