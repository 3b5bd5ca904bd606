"""Talk to a run's model: an engine that streams a chat reply token by token, served over an OpenAI-compatible
endpoint on loopback (`ortlab serve RUN`), and the client side the notebook's chat playground uses.

    ortlab.serve.engine     `Engine`: the chat template as in training, a backend (PyTorch now, ONNX later), sampling
    ortlab.serve.endpoint   the Starlette app: /v1/models, /v1/chat/completions (streamed or whole), token, limits
    ortlab.serve.listener   the socket on 127.0.0.1 and uvicorn on it; the token
    ortlab.serve.chatproc   a server in a child process and a streaming client for it (the playground's backend)

Nothing here is imported by `import ortlab`; torch and transformers load when an engine is built.
"""
