"""Processes as jobs: ``Process`` (``process``), what a job runs first
(``child``), its link to its parent (``parent_link``), its watch on it
(``lifeline``), its forwarded output (``output``), the main module it
re-imports (``main_module``), the shared resource tracker
(``resource_tracking``), and the per-process server that hosts queues,
pipes and the children's links (``hub``)."""
