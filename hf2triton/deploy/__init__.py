"""Beyond one machine: publishing to object storage, replicas, Kubernetes manifests, execution environments."""
