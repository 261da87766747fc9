"""`grpo vllm-serve`: a FastAPI + uvicorn generation server around one vLLM engine, with weight updates.

protocol.py  grpo's own protocol (version PROTOCOL_VERSION): its paths and the pydantic request bodies
host.py      the engine's single thread, weight updates in flight, their timeouts
app.py       the routes of that protocol, the API key, errors as 4xx with a reason; run_server()
trl.py       the paths and request bodies TRL's VLLMClient uses, answered by the same engine
"""
