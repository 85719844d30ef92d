"""Every child of a GRPOJob as a dict, one module per kind of child. Pure functions: no API calls.

Each builder takes the validated job (and the operator settings where it needs them) and returns the complete
object, owner reference included, so creating it is one POST and tests need no cluster. Every pod template
comes from `pod.hardened_pod` and every claim's volume and mount from `claims.mount_claim`.

- `meta`: object metadata (name, labels, owner reference) and Service DNS names.
- `pod`: the hardened pod template, its container and the run-once Job every pod of the job is built from.
- `claims`: the model, dataset, checkpoint, output and log claims as a pod mounts them.
- `raycluster`: the RayCluster and the generation Service.
- `endpoints`: the `<job>-endpoints` ConfigMap and how pods read it.
- `environments`: an environment's Deployment and Service; `nemo_gym`: the NeMo Gym variant.
- `trainer`: the trainer Job, its RBAC, its config ConfigMap (where it also reports its progress).
- `model`: a hub model's cache claim and download Job.
- `network`: the NetworkPolicy. `tensorboard`: TensorBoard's Deployment and Service.
"""
