"""``stepledger rebuild --lake``: project the step log from offset 0 into a fresh lake.

The daemon's engine with one :class:`~stepledger.projector.lake.LakeStore` per partition,
fed by the rebuild's one reader (:func:`~stepledger.projector.rebuild.read_partitions`), so
the lake's tables equal an incremental build.  Only into a lake that holds no table of the
step log yet: a lake being written by projectors is never emptied under them (rebuild into
another catalog database and point the readers there).
"""

from __future__ import annotations

import time

from stepledger.config import Settings
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ConfigError
from stepledger.kafka import topic_partitions
from stepledger.log import codec_for
from stepledger.projector.engine import DEFAULT_CACHE_WORKFLOWS, Projector
from stepledger.projector.lake import LakeDatabase, LakeStore, lake_tables
from stepledger.projector.rebuild import ProgressHook, RebuildReport, read_partitions
from stepledger.readers.lake import LakeConfig


def rebuild_lake(
    settings: Settings,
    lake: LakeConfig,
    *,
    topics: tuple[str, ...] = (),
    batch_size: int = 10_000,
    cache_workflows: int = DEFAULT_CACHE_WORKFLOWS,
    group: str = "",
    progress: ProgressHook | None = None,
) -> RebuildReport:
    """Project every partition of the topics from offset 0 into a lake without the log's tables."""
    db = LakeDatabase(lake, settings.topic)
    report = RebuildReport()
    began = time.monotonic()
    stores: list[LakeStore] = []
    try:
        present = lake_tables(db)
        if present:
            raise ConfigError(
                f"the lake already holds {len(present)} table(s) of step log {settings.topic} "
                f"(schema {db.schema}): rebuild into a fresh lake (another catalog database)"
            )
        codec = codec_for(settings)
        projectors = {}
        for topic in topics or (settings.topic,):
            for partition in topic_partitions(settings, topic):
                store = LakeStore(db, topic, partition)
                stores.append(store)
                projectors[(topic, partition)] = Projector(
                    store,
                    codec,
                    MemoryRecordLetters(),
                    group=group or settings.lake_projector_group,
                    cache_workflows=cache_workflows,
                )
        read_partitions(settings, projectors, batch_size, report, progress)
    finally:
        for store in stores:
            store.close()
        db.close()
    report.seconds = time.monotonic() - began
    return report
