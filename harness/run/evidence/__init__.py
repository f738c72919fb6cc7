"""What a run left, read back for the judge and the record: the transfer proof and KV digests,
each server's effective configuration, what the run was produced with (provenance) and how the
CPU was used while it ran (cpu_load)."""
