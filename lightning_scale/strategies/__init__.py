"""Lightning strategies of lightning-scale, registered in Lightning's StrategyRegistry on import.

The data-, model- and pipeline-parallel strategies land here with their issues; none is registered yet.
"""

__all__: list[str] = []
