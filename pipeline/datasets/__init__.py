"""Training datasets from graded trajectories: DPO pairs (TRL's conversational preference format),
ActGuide action-guidance groups and SFT examples, split by task and built incrementally per batch.

`build_rows` is the pure builder (polars frames in, rows out); `update_datasets` runs it over the
stored batches and keeps the per-batch shards and their manifest current.
"""

from pipeline.datasets.build import (SCHEMAS, BadTrajectoryFile, BatchRows, BuildReport, SkippedFile, build_rows,
                                     dataset_files, read_dataset, trajectory_frame, update_datasets)
from pipeline.datasets.config import DatasetConfig
from pipeline.datasets.files import read_trajectories
from pipeline.datasets.formats import ACTGUIDE_SCHEMA, DPO_SCHEMA, SFT_SCHEMA, arguments_as_objects
from pipeline.datasets.pairs import GuidanceLeakError
from pipeline.datasets.splits import task_split

__all__ = ["ACTGUIDE_SCHEMA", "DPO_SCHEMA", "SCHEMAS", "SFT_SCHEMA", "BadTrajectoryFile", "BatchRows", "BuildReport",
           "DatasetConfig", "GuidanceLeakError", "SkippedFile", "arguments_as_objects", "build_rows", "dataset_files",
           "read_dataset", "read_trajectories", "task_split", "trajectory_frame", "update_datasets"]
