"""Talk to a run's model: a streaming chat engine, an OpenAI-compatible endpoint on loopback, the playground's server.

The engine streams a chat reply token by token; `ortlab serve RUN` serves it over OpenAI's chat completions API; the
notebook's chat playground starts it in a child process and reads it with the client here.

    ortlab.serve.engine     `Engine`: the chat template as in training, a backend (PyTorch now, ONNX later), sampling
    ortlab.serve.endpoint   the Starlette app: /v1/models, /v1/chat/completions (streamed or whole), token, limits
    ortlab.serve.listener   the socket on 127.0.0.1 and uvicorn on it; the token
    ortlab.serve.chatproc   a server in a child process and a streaming client for it (the playground's backend)

Nothing here is imported by `import ortlab`; torch and transformers load when an engine is built.
"""
