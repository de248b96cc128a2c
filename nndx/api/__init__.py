"""API: the FastAPI service that stores, diagnoses, renders and explains reports."""
