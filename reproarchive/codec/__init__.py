"""torch objects <-> index records: tensors and storages, graphs, call targets, devices."""
