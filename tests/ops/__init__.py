"""Operations: logs, metrics, settings from the environment."""
