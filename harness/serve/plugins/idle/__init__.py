"""Plugins that stop a server's threads from spinning on cores they share."""
