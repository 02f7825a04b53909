"""Files as input and output: Parquet, TFRecord and idx shards read by the Spark tasks.

``sps.files(...)`` describes files on local disk or HDFS (:mod:`~tensorspark.fileio.source`);
the jobs (``fit``, ``evaluate``, the seed's ``run``, ``predict``) turn that description into
a plan on the driver and read it on the executors:

* driver: :mod:`~tensorspark.fileio.listing` expands paths, globs and folders through the
  storage layer (:mod:`tensorspark.storage`, the one checkpoints use) and sizes the files;
  the format modules read only metadata (Parquet footers, idx headers) to check the
  columns and cut *shards* (files, Parquet row groups, byte ranges of idx files);
  :mod:`~tensorspark.fileio.shards` balances them by bytes over the partitions (the Spark
  tasks); :mod:`~tensorspark.fileio.plan` puts it together. No row is read there.
* executors: :mod:`~tensorspark.fileio.stream` reads a task's shards every epoch in a new
  seeded order, in bounded pieces over the storage layer (:mod:`~tensorspark.fileio.rangefile`),
  through the format's reader (:mod:`~tensorspark.fileio.parquet`,
  :mod:`~tensorspark.fileio.tfrecord` with :mod:`~tensorspark.fileio.example`,
  :mod:`~tensorspark.fileio.idx`), and hands batches to the partition loop; memory stays
  at a few pieces whatever the data's size.
* output: :mod:`~tensorspark.fileio.output` writes one file per task under a staging
  folder and renames them into place when the job has succeeded;
  :mod:`~tensorspark.fileio.write` is ``sps.write_tfrecord``.

Nothing here is imported by ``import tensorspark``; pyarrow, pyspark and protobuf are
imported where used.
"""
