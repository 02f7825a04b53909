"""Tests on a real YARN cluster (Hadoop MiniYARNCluster with MiniDFSCluster) on 127.0.0.1."""
