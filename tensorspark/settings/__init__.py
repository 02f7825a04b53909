"""A :class:`~tensorspark.SparkSession`'s settings, each declared once
(:mod:`tensorspark.settings.declared`): its name, default, Spark conf key, check and doc.
The session's resolution and read-only view (:mod:`tensorspark.session_settings`) and the
Spark conf table (:data:`tensorspark.conf.SETTINGS`) are derived from the declaration."""
