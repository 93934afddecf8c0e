"""The cloud side: the template build pipeline, KV capture and importance, the bundled tasks and training."""
