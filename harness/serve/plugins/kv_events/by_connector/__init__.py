"""What one KV connector family does its own way, one module each (the table in
:func:`harness.serve.plugins.kv_events.interface.specifics_for` is keyed by the class names in
each module's ``CONNECTOR_CLASSES``)."""
