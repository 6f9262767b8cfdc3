"""Shipped tuning records (JSON lines per GPU architecture); see README.md here."""
