// Command gotmpl renders an Ollama template layer with Go's own text/template
// over Ollama's template data, as the reference the tests compare compatfs's
// Jinja translation with.  Standard input: a JSON object
//
//	{"template": "...", "system": "...", "messages": [...], "tools": [...], "think": true}
//
// (messages as OpenAI's chat API has them: role, content, reasoning_content,
// tool_calls, name, tool_call_id; "system" the model's system layer).
// Standard output: the prompt Ollama builds for that chat; an error exits 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

type Args map[string]any

func (a Args) String() string {
	if a == nil {
		return "{}"
	}
	b, _ := json.Marshal(map[string]any(a))
	return string(b)
}

type CallFunction struct {
	Index     int
	Name      string
	Arguments Args
}

type ToolCall struct {
	ID       string
	Function CallFunction
}

type Message struct {
	Role       string
	Content    string
	Thinking   string
	Images     []string
	ToolCalls  []ToolCall
	ToolName   string
	ToolCallID string
}

type Parameters struct {
	Type       string         `json:"type"`
	Defs       any            `json:"$defs,omitempty"`
	Items      any            `json:"items,omitempty"`
	Required   []string       `json:"required,omitempty"`
	Properties map[string]any `json:"properties"`
}

type ToolFunction struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Parameters  Parameters `json:"parameters"`
}

type Tool struct {
	Type     string       `json:"type"`
	Items    any          `json:"items,omitempty"`
	Function ToolFunction `json:"function"`
}

type Tools []Tool

func (t Tools) String() string {
	b, _ := json.Marshal([]Tool(t))
	return string(b)
}

type input struct {
	Template string `json:"template"`
	System   string `json:"system"`
	Messages []struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		Reasoning string `json:"reasoning_content"`
		Name      string `json:"name"`
		CallID    string `json:"tool_call_id"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string         `json:"name"`
				Arguments map[string]any `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []Tool `json:"tools"`
	Think *bool  `json:"think"`
}

var funcs = template.FuncMap{
	"json": func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	},
	"currentDate": func(args ...string) string { return time.Now().Format("2006-01-02") },
}

// names lists the field and variable names a node's pipelines mention
// (lower case), looking into branches and parenthesised pipelines.
func names(n parse.Node, out map[string]bool) {
	switch n := n.(type) {
	case *parse.ListNode:
		for _, c := range n.Nodes {
			names(c, out)
		}
	case *parse.ActionNode:
		names(n.Pipe, out)
	case *parse.IfNode:
		names(&n.BranchNode, out)
	case *parse.RangeNode:
		names(&n.BranchNode, out)
	case *parse.WithNode:
		names(&n.BranchNode, out)
	case *parse.BranchNode:
		names(n.Pipe, out)
		names(n.List, out)
		if n.ElseList != nil {
			names(n.ElseList, out)
		}
	case *parse.PipeNode:
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				names(a, out)
			}
		}
	case *parse.FieldNode:
		for _, s := range n.Ident {
			out[strings.ToLower(s)] = true
		}
	case *parse.VariableNode:
		for _, s := range n.Ident {
			out[strings.ToLower(s)] = true
		}
	}
}

// upToResponse keeps a template's nodes up to and including the first
// `.Response` field of an action: what Ollama renders for the last exchange.
type cutter struct{ cut bool }

func (c *cutter) list(l *parse.ListNode) *parse.ListNode {
	var kept []parse.Node
	for _, n := range l.Nodes {
		if c.cut {
			break
		}
		if n = c.node(n); n != nil {
			kept = append(kept, n)
		}
	}
	l.Nodes = kept
	return l
}

func (c *cutter) branch(b *parse.BranchNode) {
	b.List = c.list(b.List)
	if b.ElseList != nil {
		if c.cut {
			panic("an else after the .Response of its branch")
		}
		b.ElseList = c.list(b.ElseList)
	}
}

func (c *cutter) pipe(p *parse.PipeNode) *parse.PipeNode {
	var cmds []*parse.CommandNode
	for _, cmd := range p.Cmds {
		var args []parse.Node
		for _, a := range cmd.Args {
			if c.cut {
				break
			}
			switch a := a.(type) {
			case *parse.FieldNode:
				for _, s := range a.Ident {
					if s == "Response" {
						c.cut = true
					}
				}
				args = append(args, a)
			case *parse.PipeNode:
				if q := c.pipe(a); q != nil {
					args = append(args, q)
				}
			default:
				args = append(args, a)
			}
		}
		if len(args) == 0 {
			return nil
		}
		cmd.Args = args
		cmds = append(cmds, cmd)
	}
	p.Cmds = cmds
	return p
}

func (c *cutter) node(n parse.Node) parse.Node {
	switch n := n.(type) {
	case *parse.ActionNode:
		if p := c.pipe(n.Pipe); p != nil {
			n.Pipe = p
			return n
		}
		return nil
	case *parse.IfNode:
		c.branch(&n.BranchNode)
	case *parse.RangeNode:
		c.branch(&n.BranchNode)
	case *parse.WithNode:
		c.branch(&n.BranchNode)
	}
	return n
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		fail(err)
	}
	t, err := template.New("").Option("missingkey=zero").Funcs(funcs).Parse(in.Template)
	if err != nil {
		fail(err)
	}
	vars := map[string]bool{}
	names(t.Tree.Root, vars)
	if !vars["messages"] && !vars["response"] {
		resp := &parse.ActionNode{NodeType: parse.NodeAction, Pipe: &parse.PipeNode{NodeType: parse.NodePipe,
			Cmds: []*parse.CommandNode{{NodeType: parse.NodeCommand,
				Args: []parse.Node{&parse.FieldNode{NodeType: parse.NodeField, Ident: []string{"Response"}}}}}}}
		t.Tree.Root.Nodes = append(t.Tree.Root.Nodes, resp)
	}

	// The model's system layer when the chat does not open with a system message.
	var msgs []Message
	if len(in.Messages) > 0 && in.Messages[0].Role != "system" && in.System != "" {
		msgs = append(msgs, Message{Role: "system", Content: in.System})
	}
	for _, m := range in.Messages {
		msg := Message{Role: m.Role, Content: m.Content, Thinking: m.Reasoning, ToolName: m.Name, ToolCallID: m.CallID}
		for _, c := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: c.ID, Function: CallFunction{Name: c.Function.Name, Arguments: Args(c.Function.Arguments)}})
		}
		msgs = append(msgs, msg)
	}
	// Consecutive messages of one role (but tool results) are one message;
	// every system message is also part of .System.
	var systems []string
	var joined []*Message
	for i := range msgs {
		m := &msgs[i]
		if m.Role == "system" {
			systems = append(systems, m.Content)
		}
		if n := len(joined); n > 0 && joined[n-1].Role == m.Role && m.Role != "tool" {
			joined[n-1].Content += "\n\n" + m.Content
		} else {
			joined = append(joined, m)
		}
	}
	// Ollama turns thinking on where a request leaves it unset and the
	// model's template thinks (here: names .Thinking).
	think := in.Think != nil && *in.Think || in.Think == nil && strings.Contains(in.Template, ".Thinking")
	var out bytes.Buffer
	if vars["messages"] {
		var tools Tools
		if in.Tools != nil {
			tools = Tools(in.Tools)
		}
		err = t.Execute(&out, map[string]any{"System": strings.Join(systems, "\n\n"), "Messages": joined,
			"Tools": tools, "Response": "", "Think": think, "ThinkLevel": "", "IsThinkSet": in.Think != nil})
		if err != nil {
			fail(err)
		}
		os.Stdout.Write(out.Bytes())
		return
	}
	// The older form: one execution per exchange (system, prompt, response),
	// the last one only up to its .Response.
	data := func(system, prompt, response string) map[string]any {
		return map[string]any{"System": system, "Prompt": prompt, "Response": response,
			"Think": think, "ThinkLevel": "", "IsThinkSet": in.Think != nil}
	}
	var system, prompt, response string
	flush := func() {
		if err := t.Execute(&out, data(system, prompt, response)); err != nil {
			fail(err)
		}
		system, prompt, response = "", "", ""
	}
	for _, m := range joined {
		switch m.Role {
		case "system":
			if prompt != "" || response != "" {
				flush()
			}
			system = m.Content
		case "user":
			if response != "" {
				flush()
			}
			prompt = m.Content
		case "assistant":
			response = m.Content
		}
	}
	last := (&cutter{}).list(t.Tree.Root.CopyList())
	final := template.Must(template.New("").AddParseTree("", &parse.Tree{Root: last}))
	if err := final.Execute(&out, data(system, prompt, response)); err != nil {
		fail(err)
	}
	os.Stdout.Write(out.Bytes())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
