"""The core room: models, envelope, errors, tasks."""
