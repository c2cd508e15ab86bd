"""Change events to Arrow tables, column-wise: the compiled converter (:mod:`.native`, built from
``_native.c``) and the pure-Python path (:mod:`.python`) give the same table for the same
:mod:`.plan`; :mod:`.arrow` chooses between them. Imports pyarrow, never pyspark."""
