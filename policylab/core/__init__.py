"""Core: requests, the step contract, KV blocks, the engine loop and its clocks. numpy only."""
