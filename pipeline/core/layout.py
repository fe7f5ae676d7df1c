"""Where everything lives under the data folder: every path a stage writes or reads, and the typed readers
of the stored tables. Nothing else names a folder of the data folder.

    cache/                                    sdists, wheels, synthesized tasks per package and settings (or cache_dir)
    sources/dataset_tasks.parquet             public dataset rows read (task_sources), and their rejects
    tasks/tasks.parquet                       validated tasks, their rejects, the synthesis report
    trajectories/{unguided,guided}/<batch>/   one batch's attempts (trajectories.parquet, shards/); unguided/<batch>/
                                              round.json: the policy that rolled the batch out (pipeline/rollouts/rounds.py)
    trajectories/probes/<batch>/<task>/       the action-prefix search's probes, stored as batch <batch>-probes
    guidance/<batch>/guidance.parquet         the rescue's plans
    datasets/rows/, datasets/hf/              the built rows per kind and batch; the exported dataset
    models/<stage>/<batch>/, models/tiny/     a training run's folder; the tiny offline model
    evaluation/<batch>/<model>/               each model's held-out attempts, and pass_at_1.json
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline.core.records import GUIDANCE_PLAN_SCHEMA, TASK_SCHEMA, TRAJECTORY_SCHEMA, GuidancePlan, Task, Trajectory
from pipeline.core.store import read_batch, read_records, read_table

ORIGINS = ("unguided", "guided", "probes")
"""The folders under trajectories/: attempts without guidance, with it, and the prefix search's probes."""
WRITTEN_BY = {"unguided": "unguided_rollouts", "guided": "guided_rollouts", "probes": "guidance"}
"""The asset that writes each origin's attempts (named when a file is missing)."""
PROBE_SUFFIX = "-probes"
"""The probes of batch B are stored as batch B-probes (their `batch` column)."""


def probe_batch(batch: str) -> str:
    """The batch name the probes of `batch` are stored under."""
    return f"{batch}{PROBE_SUFFIX}"


@dataclass(frozen=True)
class Layout:
    """The data folder `root`; `cache_root`, when given, holds the cache instead of root/cache. A path's parent
    folder exists once the path is asked for."""

    root: Path
    cache_root: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())
        if self.cache_root is not None:
            object.__setattr__(self, "cache_root", Path(self.cache_root).resolve())

    def _at(self, *parts: str) -> Path:
        out = self.root.joinpath(*parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    # task sources and tasks
    def cache(self) -> Path:
        if self.cache_root is None:
            return self._at("cache")
        self.cache_root.mkdir(parents=True, exist_ok=True)
        return self.cache_root

    def dataset_tasks(self) -> Path:
        return self._at("sources", "dataset_tasks.parquet")

    def dataset_rejects(self) -> Path:
        return self._at("sources", "dataset_rejects.parquet")

    def tasks(self) -> Path:
        return self._at("tasks", "tasks.parquet")

    def task_rejects(self) -> Path:
        return self._at("tasks", "rejects.parquet")

    def synth_report(self) -> Path:
        return self._at("tasks", "synth_report.json")

    def source_store(self) -> Path:
        """Where each task source's last validated tasks are kept (only new sources are validated)."""
        return self._at("tasks", "sources")

    def rechecks(self) -> Path:
        """The tasks' re-validation records, one file per run and source (pipeline/tasks/flakiness.py)."""
        folder = self._at("tasks", "rechecks")
        folder.mkdir(exist_ok=True)
        return folder

    def read_dataset_tasks(self) -> list[Task]:
        """The public dataset rows task_sources read (not validated yet)."""
        return [Task.from_row(r) for r in read_records(self.dataset_tasks(), TASK_SCHEMA, produced_by="task_sources")]

    def read_tasks(self) -> list[Task]:
        """The validated tasks, checked against the task contract."""
        return [Task.from_row(r) for r in self.tasks_table().to_pylist()]

    def tasks_table(self) -> pa.Table:
        """The validated tasks as stored, checked against the task contract."""
        return read_table(self.tasks(), TASK_SCHEMA, produced_by="tasks")

    # attempts and guidance
    def trajectories(self, origin: str, batch: str) -> Path:
        """A batch's folder of attempts: `origin` one of ORIGINS."""
        if origin not in ORIGINS:
            raise ValueError(f"unknown trajectory origin {origin!r}; choose from {list(ORIGINS)}")
        return self._at("trajectories", origin, batch)

    def round_record(self, batch: str) -> Path:
        """The batch's round record: which policy rolled it out, and what made that policy."""
        return self.trajectories("unguided", batch) / "round.json"

    def round_batches(self) -> list[str]:
        """Batches with a round record, in name order."""
        return sorted(p.parent.name for p in self._at("trajectories", "unguided").glob("*/round.json"))

    def trajectory_file(self, origin: str, batch: str) -> Path:
        """A batch's compacted attempts."""
        return self.trajectories(origin, batch) / "trajectories.parquet"

    def read_trajectories(self, origin: str, batch: str) -> list[Trajectory]:
        """A batch's compacted attempts, checked against the trajectory contract."""
        return [Trajectory.from_row(r) for r in read_records(self.trajectory_file(origin, batch), TRAJECTORY_SCHEMA,
                                                              produced_by=WRITTEN_BY[origin], batch=batch)]

    def read_probes(self, batch: str) -> list[Trajectory]:
        """A batch's action-search probes, every task's folder (none: [])."""
        return [t for folder in sorted(self.trajectories("probes", batch).glob("*/"))
                for t in read_batch(folder, WRITTEN_BY["probes"], batch)]

    def trajectory_files(self, origin: str | None = None) -> list[Path]:
        """Every batch's compacted file, of one origin or of unguided and guided attempts (not probes)."""
        origins = [origin] if origin else ["unguided", "guided"]
        return sorted(f for o in origins for f in self._at("trajectories", o).glob("*/trajectories.parquet"))

    def newest_batch(self) -> str:
        """The batch whose attempts were stored last ('' before any)."""
        files = self.trajectory_files()
        return max(files, key=lambda f: f.stat().st_mtime_ns).parent.name if files else ""

    def batch_names(self) -> list[str]:
        """Batches with stored attempts of any origin, in name order."""
        root = self.root / "trajectories"
        return sorted({p.name for origin in ORIGINS for p in (root / origin).glob("*")
                       if p.is_dir() and not p.name.startswith(".")})

    def batch_files(self, batch: str, include_probes: bool = True) -> list[Path]:
        """A batch's trajectory files: each folder's compacted file, then its shards."""
        root = self.root / "trajectories"
        folders = [root / "unguided" / batch, root / "guided" / batch]
        if include_probes:
            folders += sorted(p for p in (root / "probes" / batch).glob("*") if p.is_dir())
        return [f for folder in folders
                for f in [folder / "trajectories.parquet", *sorted((folder / "shards").glob("*.parquet"))] if f.exists()]

    def guidance(self, batch: str) -> Path:
        return self._at("guidance", batch, "guidance.parquet")

    def guidance_files(self) -> list[Path]:
        return sorted(self._at("guidance").glob("*/guidance.parquet"))

    def read_plans(self, batch: str) -> list[GuidancePlan]:
        """A batch's rescue plans, checked against their contract."""
        return [GuidancePlan.from_row(r) for r in read_records(self.guidance(batch), GUIDANCE_PLAN_SCHEMA,
                                                                produced_by="guidance", batch=batch)]

    # datasets, models, evaluation
    def dataset_rows(self) -> Path:
        return self._at("datasets", "rows")

    def export(self) -> Path:
        return self._at("datasets", "hf")

    def releases(self) -> Path:
        return self._at("datasets", "releases")

    def training_run(self, stage: str, batch: str) -> Path:
        return self._at("models", stage, batch)

    def checkpoint_batches(self, stage: str) -> list[str]:
        """The batches whose `stage` training run left a checkpoint, in name order."""
        return sorted(p.parent.name for p in self._at("models", stage).glob("*/checkpoint") if p.is_dir())

    def tiny_model(self) -> Path:
        return self._at("models", "tiny")

    def evaluation(self, batch: str, model: str) -> Path:
        return self._at("evaluation", batch, model)

    def pass_at_1(self, batch: str) -> Path:
        return self._at("evaluation", batch, "pass_at_1.json")

    def latest_pass_at_1(self) -> Path | None:
        """The evaluation report written last; None before any."""
        reports = sorted(self._at("evaluation").glob("*/pass_at_1.json"), key=lambda p: p.stat().st_mtime_ns)
        return reports[-1] if reports else None
