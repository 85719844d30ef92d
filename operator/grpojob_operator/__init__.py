"""The Kopf operator that turns a GRPOJob into a KubeRay RayCluster, environment pods and a trainer."""
