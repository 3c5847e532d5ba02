"""Processes as jobs: ``Process`` (``process``), the children it started
(``children``), what a job runs first (``child``), its link to its parent
(``parent_link``), its watch on it (``lifeline``), its forwarded output
(``output``), the main module it re-imports (``main_module``), the shared
resource tracker (``resource_tracking``), the pipe ends a launch carries
(``handover``), the per-process server that hosts queues, pipes and the
children's links (``hub``), and the server local jobs are forked from
(``fork_server``)."""
