"""The gossip failure detector (issue 4); nothing here yet but the package."""
