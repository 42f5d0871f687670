"""Widgets of the tokview app: the Line-API token view, the sample list, the detail panel."""
