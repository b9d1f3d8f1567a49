"""No Django models: pylease's table and functions are its SQL schema, installed by the
app's migration. This module exists because Django sends post_migrate only to apps that
have one."""
