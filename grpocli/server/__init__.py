"""`grpo vllm-serve`: a FastAPI + uvicorn generation server around one vLLM engine, with weight updates.

protocol.py  the request bodies (ours, version PROTOCOL_VERSION, and TRL's VLLMClient's)
host.py      the engine's single thread, weight updates in flight, their timeouts
app.py       the routes, the API key, errors as 4xx with a reason; run_server()
trl.py       the paths and fields TRL's VLLMClient uses, on the same engine
"""
