"""Conversations as the API shows them: lists, details, exports, rename and delete."""
