"""The runtime: KV page pool and state slots, the executor with two frame slots, and the engine
loop that drives the scheduler (``api`` holds the engine's interface to the server)."""
