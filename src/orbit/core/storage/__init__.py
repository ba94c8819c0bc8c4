"""Storage with a lifecycle: the control plane keeps one copy of each attempt's files and each
bundle, and this package says what that costs and when it goes.

- (orbit.model.retention: the retention rules; orbit.model.storage: what gc, delete and usage
  hand back)
- disk.py: measuring and removing folders, free space;
- checkpoints.py: a run's checkpoints by ORBIT's convention, and which of them a rule removes;
- wire.py: collect over HTTP, incremental and resumable: what the client has, what differs,
  and the tar stream that carries only that.

May import the vocabulary, the runtime and the execution plane."""
