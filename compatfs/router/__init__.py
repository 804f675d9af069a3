"""llama-server's side: `params` the params layer (each Ollama option's flag
and sampling key), `models` a model's files, `llama_args` (`llama-args`,
`run`), `preset` (`models.ini`), `serve` (the router)."""
