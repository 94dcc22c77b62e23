from engine.horing.topology import Topology

__all__ = ["Topology"]
