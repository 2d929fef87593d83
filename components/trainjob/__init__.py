"""The Kubeflow Trainer TrainJob of a multi-node finetune, in one room: its spec (:mod:`.spec`), the launcher in the
step process that creates it for one run (:mod:`.gang`) and what the launcher uses to create, watch and cancel it
(:mod:`.launch`, :mod:`.client`, :mod:`.status`, :mod:`.cancel`) with the rights it needs (:mod:`.rbac`).
docs/scaling.md says how a gang runs."""
