//! Reading the Query APIs' XML responses (EC2: `<fooSet><item>` lists; ELBv2: `<Foos><member>`
//! lists), by local element name, namespaces ignored.

use roxmltree::Node;

/// The first child element named `name`.
pub fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

/// The text of the child element named `name` (`None` when absent or empty).
pub fn text<'a>(node: Node<'a, '_>, name: &str) -> Option<&'a str> {
    child(node, name)
        .and_then(|c| c.text())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// [`text`] as an owned string.
pub fn string(node: Node<'_, '_>, name: &str) -> Option<String> {
    text(node, name).map(String::from)
}

/// [`text`] parsed as a number.
pub fn number<T: std::str::FromStr>(node: Node<'_, '_>, name: &str) -> Option<T> {
    text(node, name).and_then(|t| t.parse().ok())
}

/// [`text`] as a boolean (`true`/`false`).
pub fn boolean(node: Node<'_, '_>, name: &str) -> Option<bool> {
    text(node, name).and_then(|t| t.parse().ok())
}

/// The list elements (`item` or `member`) of the child element named `name`.
pub fn list<'a, 'i>(node: Node<'a, 'i>, name: &str) -> impl Iterator<Item = Node<'a, 'i>> {
    child(node, name)
        .into_iter()
        .flat_map(|c| c.children())
        .filter(|c| c.is_element() && matches!(c.tag_name().name(), "item" | "member"))
}

/// Tags of an EC2 `tagSet` or an ELBv2 `Tags` list.
pub fn tags(node: Node<'_, '_>, name: &str) -> std::collections::BTreeMap<String, String> {
    list(node, name)
        .filter_map(|t| {
            let key = text(t, "key").or_else(|| text(t, "Key"))?;
            let value = text(t, "value").or_else(|| text(t, "Value")).unwrap_or("");
            Some((key.to_string(), value.to_string()))
        })
        .collect()
}

/// The response's result element: ELBv2 wraps it as `<XResponse><XResult>`; EC2 has none (the
/// response element itself).
pub fn result<'a, 'i>(doc: &'a roxmltree::Document<'i>) -> Node<'a, 'i> {
    let root = doc.root_element();
    root.children()
        .find(|c| c.is_element() && c.tag_name().name().ends_with("Result"))
        .unwrap_or(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_texts_and_tags() {
        let doc = roxmltree::Document::parse(
            r#"<R xmlns="urn:x"><aSet><item><id> a </id><tagSet><item><key>k</key><value>v</value></item></tagSet></item><item><id/></item></aSet><n>5</n></R>"#,
        )
        .unwrap();
        let root = doc.root_element();
        let items: Vec<_> = list(root, "aSet").collect();
        assert_eq!(items.len(), 2);
        assert_eq!(text(items[0], "id"), Some("a"));
        assert_eq!(text(items[1], "id"), None);
        assert_eq!(tags(items[0], "tagSet")["k"], "v");
        assert_eq!(number::<u32>(root, "n"), Some(5));
        assert_eq!(list(root, "missing").count(), 0);
        assert_eq!(result(&doc).tag_name().name(), "R");
    }
}
