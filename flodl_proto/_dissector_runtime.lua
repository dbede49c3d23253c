-- ---------------------------------------------------------------------------------------------
-- Runtime: the fixed part of the dissector. It interprets the SPEC table above (layouts, enums,
-- limits, variants, error texts); it holds no per-field code.
-- ---------------------------------------------------------------------------------------------
local C = SPEC.const
local ENUMS = SPEC.enums
local LAYOUTS = SPEC.layouts
local M = SPEC.markers

-- This file loaded a second time (installed as a plugin and given with -X lua_script too): the
-- protocol is registered already, so the copy loaded first dissects and this one steps aside.
local registered, proto = pcall(Proto, SPEC.proto.name, SPEC.proto.description)
if not registered then
    local known, first = pcall(Dissector.get, SPEC.proto.name)
    if known and first then do return end end
    error(proto, 0)  -- any other failure is reported as Wireshark reports a script's error
end

-- Filter fields ---------------------------------------------------------------------------------
local F, LABEL, field_list = {}, {}, {}
for _, d in ipairs(SPEC.fields) do
    local vs = nil
    if d.enum then vs = ENUMS[d.enum].names end
    local b = nil
    if d.base then b = base[d.base] end
    local f = ProtoField.new(d.label, d.abbrev, ftypes[d.ftype], vs, b, nil, d.doc)
    F[d.abbrev] = f
    LABEL[d.abbrev] = d.label
    field_list[#field_list + 1] = f
end
proto.fields = field_list
local P = SPEC.proto.name .. "."
local function field(name) return F[P .. name] end

-- Expert infos ----------------------------------------------------------------------------------
local E, expert_list = {}, {}
for _, d in ipairs(SPEC.experts) do
    local e = ProtoExpert.new(d.abbrev, d.text, expert.group[d.group], expert.severity[d.severity])
    E[d.id] = e
    expert_list[#expert_list + 1] = e
end
proto.experts = expert_list

-- Preferences -----------------------------------------------------------------------------------
local version_choices = { { 1, "auto", 0 } }
for i, v in ipairs(SPEC.versions.supported) do
    version_choices[#version_choices + 1] = { i + 1, tostring(v), v }
end
proto.prefs.ports = Pref.range("TCP ports", SPEC.ports,
    "TCP ports always decoded as " .. SPEC.proto.name .. " (other ports are found by the "
    .. "heuristic on the magics, or with Decode As)", 65535)
proto.prefs.version = Pref.enum("Protocol version", 0,
    "Data-channel protocol version: auto takes it from the handshake, the ack or a Hello's "
    .. "model_sigs (default " .. SPEC.versions.default .. " until detected)", version_choices, false)
proto.prefs.bytes_limit = Pref.uint("Payload field limit (bytes)", SPEC.bytes_field_limit,
    "A payload above this size is shown as a byte range without a field value, which keeps "
    .. "exports (tshark -T json) small; 0 = no limit")
proto.prefs.ceiling = Pref.uint("Frame ceiling (bytes)", C.DEFAULT_FRAME_CEILING,
    "A length above this is reported as malformed (the readers' default ceiling is 1 GiB)")

-- Helpers ---------------------------------------------------------------------------------------
-- A catalogue text filled from args; a noun written word(s) is word after a field the text
-- writes as 1 and words otherwise, as the package's own messages read (errors._agreed: the
-- catalogue's plural rule).
local function errtext(id, args)
    local t = SPEC.errors[id] or id
    local out, pos, one = {}, 1, false
    local function agreed(literal)
        return (literal:gsub("(%w+)%(s%)", one and "%1" or "%1s"))
    end
    while true do
        local s, e, name, spec = t:find("{([%w_]+):?([^}]*)}", pos)
        if s == nil then break end
        out[#out + 1] = agreed(t:sub(pos, s - 1))
        local v = args[name]
        if v == nil then
            out[#out + 1] = "{" .. name .. "}"
        elseif spec ~= "" then
            out[#out + 1] = string.format("%" .. spec, v)
        else
            out[#out + 1] = tostring(v)
        end
        one = out[#out] == "1"
        pos = e + 1
    end
    out[#out + 1] = agreed(t:sub(pos))
    return table.concat(out)
end

-- The readers' texts begin with the module that raised them: "relay_mux:" for a len-framed blob
-- too, whose reader lives there, though the blob is on the loopback leg (rank ↔ relay). The
-- dissector names the leg the record is on.
local function loopback_errtext(id, args)
    local t = errtext(id, args)
    local rest = t:match("^relay_mux: (.*)$")
    if rest then return "loopback leg: " .. rest end
    return t
end

-- the e with |x| in [2^(e-1), 2^e), for a finite x other than 0 (math.frexp's, which Lua 5.4,
-- the Lua of newer Wireshark releases, does not have)
local function exponent(x)
    local a = math.abs(x)
    local e = math.floor(math.log(a, 2)) + 1
    if 2 ^ (e - 1) > a then  -- the logarithm rounded up or down across a power of two
        e = e - 1
    elseif 2 ^ e <= a then
        e = e + 1
    end
    return e
end

-- x rounded to a binary format of `bits` significant bits whose smallest normal exponent is emin
-- (below it, the subnormals' fixed step), ties to even: how an f32 (24, -126) or a bf16 (8, -126)
-- takes a decimal number
local function round_to(x, bits, emin)
    if x == 0 or x ~= x or x == math.huge or x == -math.huge then return x end
    local e = exponent(x)
    local step = 2 ^ (math.max(e, emin + 1) - bits)
    local q = x / step
    local r = math.floor(q + 0.5)
    if r - q == 0.5 and r % 2 ~= 0 then r = r - 1 end
    return r * step
end

-- the significant digits that always give a value back: f64 17, f32 9, bf16 4
local DIGITS = { [53] = 17, [24] = 9, [8] = 4 }
-- p significant digits in exponent form ("d.ddde+XX"), the nearest decimal of p digits
local FMT = {}
for p = 1, 17 do FMT[p] = "%." .. (p - 1) .. "e" end

local function reads_back(s, x, bits)
    local back = tonumber(s)
    if bits then back = round_to(back, bits, -126) end
    return back == x
end

-- s (in FMT's form) with its last digit one up: the next decimal of as many digits above it
local function digit_up(s)
    local m, e = s:match("^([%d%.]+)e([-+]%d+)$")
    local digits, exp = m:gsub("%.", ""), tonumber(e)
    local i = #digits
    while i > 0 and digits:sub(i, i) == "9" do i = i - 1 end
    if i == 0 then
        digits, exp = "1" .. string.rep("0", #digits - 1), exp + 1
    else
        digits = digits:sub(1, i - 1) .. string.char(digits:byte(i) + 1)
            .. string.rep("0", #digits - i)
    end
    if #digits > 1 then digits = digits:sub(1, 1) .. "." .. digits:sub(2) end
    return digits .. string.format("e%s%02d", exp < 0 and "-" or "+", math.abs(exp))
end

-- the digits of s (in FMT's form) laid out as Python's repr lays out a float's: written out for
-- a decimal exponent from -4 to 15 (0.0001, 1000000000000000.0, with ".0" when whole), in
-- exponent form outside it (9.99e-05, 1e+16, 1.2345678901234568e+16)
local function repr_layout(s, negative)
    local m, e = s:match("^([%d%.]+)e([-+]%d+)$")
    local digits, exp = m:gsub("%.", ""):gsub("0+$", ""), tonumber(e)
    if digits == "" then digits = "0" end
    local out
    if exp >= -4 and exp < 16 then
        if exp >= #digits - 1 then
            out = digits .. string.rep("0", exp - #digits + 1) .. ".0"
        elseif exp >= 0 then
            out = digits:sub(1, exp + 1) .. "." .. digits:sub(exp + 2)
        else
            out = "0." .. string.rep("0", -exp - 1) .. digits
        end
    else
        out = digits:sub(1, 1)
        if #digits > 1 then out = out .. "." .. digits:sub(2) end
        out = out .. string.format("e%s%02d", exp < 0 and "-" or "+", math.abs(exp))
    end
    return (negative and "-" or "") .. out
end

-- A number in the fewest significant digits that read back as the same value, in the f64 the
-- Lua number is (bits nil), or in the f32 or bf16 it came from (bits 24 or 8), laid out as
-- Python's repr lays out a float: for an f64 the text of Python's repr, digits and form; for an
-- f32 the digits numpy's shortest form gives. A whole number below 1e16 is written as one,
-- with ".0" (an f64's repr; an element's exact value, as its f64 repr).
local function fmt_num(x, bits)
    if x ~= x then return "NaN" end
    if x == math.huge then return "inf" end
    if x == -math.huge then return "-inf" end
    if x == math.floor(x) and math.abs(x) < 1e16 then return string.format("%.1f", x) end
    local negative, a = x < 0, math.abs(x)
    local most = DIGITS[bits or 53]
    local best = string.format(FMT[most], a)
    local e = exponent(a)
    if a == 2 ^ (e - 1) then
        -- a power of two: its lower neighbour is nearer than its upper one, so a count of
        -- digits can fail where a smaller one reads back, and the nearest decimal of a count
        -- (below a) can fail where the one above a reads back; count up, trying both
        for p = 1, most - 1 do
            local s = string.format(FMT[p], a)
            if reads_back(s, a, bits) then return repr_layout(s, negative) end
            if tonumber(s) < a then
                s = digit_up(s)
                if reads_back(s, a, bits) then return repr_layout(s, negative) end
            end
        end
        return repr_layout(best, negative)
    end
    -- the neighbours are as far on either side: once a count of digits fails, every smaller
    -- one does (the nearest p-digit number is at least as near as any shorter one), so count
    -- down from the most (most values need 8 or 9 of an f32's 9)
    if bits then
        -- a number reads back as a when it is nearer a than half the step between a and its
        -- neighbours (at half, when a is even), the test round_to makes, taken once for a
        local step = 2 ^ (math.max(e, -125) - bits)
        local half, even = step / 2, (a / step) % 2 == 0
        for p = most - 1, 1, -1 do
            local s = string.format(FMT[p], a)
            local off = math.abs(tonumber(s) - a)
            if off > half or (off == half and not even) then break end
            best = s
        end
        return repr_layout(best, negative)
    end
    for p = most - 1, 1, -1 do
        local s = string.format(FMT[p], a)
        if tonumber(s) ~= a then break end
        best = s
    end
    return repr_layout(best, negative)
end

-- an f64 as Rust's Display ({}) writes it, as the reader's error quotes a weight: the shortest
-- digits that read back, written out without an exponent (-1, -0.5, -25000000000000000,
-- -0.0000001), NaN, inf, -inf
local function rust_display(x)
    local s = fmt_num(x)
    local sign, int, frac, exp = s:match("^(-?)(%d+)%.?(%d*)[eE]([-+]?%d+)$")
    if sign == nil then return (s:gsub("%.0$", "")) end
    local digits, point = int .. frac, #int + tonumber(exp)
    while #digits > 1 and digits:sub(1, 1) == "0" do
        digits, point = digits:sub(2), point - 1
    end
    digits = digits:gsub("0+$", "")
    if digits == "" then return sign .. "0" end
    if point <= 0 then return sign .. "0." .. string.rep("0", -point) .. digits end
    if point >= #digits then return sign .. digits .. string.rep("0", point - #digits) end
    return sign .. digits:sub(1, point) .. "." .. digits:sub(point + 1)
end

-- "1 byte", "2 bytes"
local function count_bytes(n)
    return n .. (n == 1 and " byte" or " bytes")
end

local function fmt_bytes(n)
    if n >= 1048576 then return string.format("%.1f MiB", n / 1048576) end
    if n >= 1024 then return string.format("%.1f KiB", n / 1024) end
    return string.format("%d B", n)
end

local function fmt_list(t)
    local s = {}
    for i, v in ipairs(t) do s[i] = tostring(v) end
    return "[" .. table.concat(s, ",") .. "]"
end

local function f32_from_bits(b)
    local sign = 1
    if b >= 0x80000000 then sign = -1; b = b - 0x80000000 end
    local e = math.floor(b / 0x800000)
    local m = b % 0x800000
    if e == 255 then
        if m == 0 then return sign * math.huge end
        return 0 / 0
    end
    if e == 0 then return sign * m * 2 ^ -149 end
    return sign * (1 + m / 0x800000) * 2 ^ (e - 127)
end

-- element decoders by Dtype member name, and the significant bits of each (for fmt_num)
local ELEMENT = {
    F32 = function(r) return r:le_float() end,
    BF16 = function(r) return f32_from_bits(r:le_uint() * 65536) end,
}
local ELEMENT_BITS = { F32 = 24, BF16 = 8 }

local function u32(tvb, off) return tvb(off, 4):le_uint() end

local function read_value(ty, r)
    if ty == "u8" or ty == "u32" then return r:le_uint() end
    if ty == "u64" then return r:le_uint64():tonumber() end
    if ty == "f64" then return r:le_float() end
    return nil
end

-- a zero-length range at off (Wireshark refuses a range starting past the end)
local function at(tvb, off, len)
    if off >= tvb:len() then return tvb(tvb:len() > 0 and tvb:len() - 1 or 0, 0) end
    return tvb(off, len or 0)
end

-- Conversation state (per TCP connection) --------------------------------------------------------
local f_tcp_stream = Field.new("tcp.stream")
local convs = {}
local frame_conv = {}  -- frame number -> the state its first dissection used

-- Keyed by the TCP stream (so a connection that reuses an earlier one's ports starts afresh), or,
-- where tcp.stream has no value (a pass without a tree, as tshark -2's first), by the two
-- endpoints in either direction. A packet seen again (a later pass) takes the state its first
-- dissection used, so a second pass keeps what the first learned (the version, the ranks).
local function conv_key(pinfo)
    local fi = f_tcp_stream()
    if fi then return "s" .. tostring(fi.value) end
    local a = tostring(pinfo.src) .. "/" .. pinfo.src_port
    local b = tostring(pinfo.dst) .. "/" .. pinfo.dst_port
    return a < b and (a .. " " .. b) or (b .. " " .. a)
end

local function conv_of(pinfo)
    if pinfo.visited then
        local seen = frame_conv[pinfo.number]
        if seen then return seen end
    end
    local key = conv_key(pinfo)
    local c = convs[key]
    if not c then c = {}; convs[key] = c end
    if not pinfo.visited then frame_conv[pinfo.number] = c end
    return c
end

-- A new connection on the ports of an earlier one (keyed by the endpoints, the two share a key):
-- the state starts afresh from this packet on; the earlier packets keep theirs.
local function conv_afresh(pinfo)
    local c = {}
    convs[conv_key(pinfo)] = c
    frame_conv[pinfo.number] = c
    return c
end

-- Record boundaries (per direction of a connection) ----------------------------------------------
-- A record whose length is known but which goes on past its segment, where TCP does not put it
-- together (reassembly off, or a length above the frame ceiling, for which none is asked), is
-- continued by the direction's next segments: their bytes, up to the record's end, are shown as
-- its continuation, and what follows is read as a new record. A direction is in sync once a
-- segment has started a record in it; out of sync (a capture that began inside a record, or after
-- bytes that start no record), a segment that does not start one is skipped, with one expert info
-- for the whole stretch. The state runs on the first pass, in capture order; a packet seen again
-- takes the state its first dissection started from (frame_start), kept only for the packets
-- that began out of sync or inside a record.
--
-- Where TCP hands the segments themselves (no reassembly), a segment is placed by its TCP
-- sequence number, not by the bytes counted before it: the direction remembers the state at the
-- start and end of its recent segments, so a retransmission, or a segment captured after one that
-- follows it, is read from the state at its sequence number without moving the direction's; a
-- segment after bytes not captured continues the record going on if it ends past them, and
-- otherwise may begin inside an unseen record (out of sync, without an expert info: TCP reports
-- the gap); one captured late inside such bytes (sent again after the segments that follow it)
-- is placed from the state at its end, where that is known. tcp.seq has no value on a pass without a tree (tshark -2's first): there the bytes
-- are counted, and the second pass, in capture order, runs the state again over every segment of
-- the direction that pass had (those TCP hands over for reassembly too, whose sequence numbers
-- place what TCP keeps back), with as many calls each, and places the segments by their sequence
-- numbers (frame_redo); where its segments or calls differ from that pass's, the first pass's
-- states stand from there on.
--
-- Without reassembly, a record header cut by the end of its segment is kept (head) and completed
-- from the direction's next segment; so is a channel magic, handshake or ack (a fixed size, read
-- whole). Out of sync, a segment that ends with bytes too few to tell whether a record starts at
-- them (fewer than a magic, or a loopback length without the RoundFrame magic after it) keeps
-- them as well (head, a possible record header): with the next segment's bytes they begin a
-- record, and the direction is in sync, or they do not, and that segment is read on its own.
--
-- A packet longer than the capture's snaplen holds fewer bytes (tvb:len()) than its segment
-- (tvb:reported_len()), and TCP reassembles none of it: the segment is placed and ended by its
-- length on the wire, a record going on past the cut is shown as cut by the capture, and where the
-- cut bytes hold record starts the direction is out of sync after them. A record (or record
-- header) TCP was asked to reassemble from a whole segment goes on in the next segment when TCP
-- hands that one over itself (asked: the capture cut it); TCP keeps the record's later whole
-- segments (held), and the first whole segment it hands over after them starts after the record.
local frame_start = {}  -- frame number -> { len, sync, quiet, pend, head } at its start
local frame_redo = {}   -- frame number -> the same for each of its calls, placed again later
local frame_prev = {}   -- frame number -> the direction's previous one (0: none), bytes counted
local frame_calls = {}  -- frame number -> the calls for it on the pass that counted its bytes
local IN_SYNC = { sync = true }
local f_tcp_seq = Field.new("tcp.seq")
local f_tcp_len = Field.new("tcp.len")
local SEQ_MOD = 4294967296
local KEEP_STATES = 4096  -- states a direction keeps by sequence number (two generations of)

local function direction_key(pinfo)
    return tostring(pinfo.src) .. "/" .. pinfo.src_port
end

-- a - b for two sequence numbers (modulo 2^32), signed
local function seq_diff(a, b)
    local d = (a - b) % SEQ_MOD
    if d >= SEQ_MOD / 2 then d = d - SEQ_MOD end
    return d
end

-- The sequence number of the segment's first byte, where TCP hands the segment itself (no
-- reassembly) and tcp.seq has a value (the innermost TCP header's); else nil.
local function segment_seq(pinfo)
    if pinfo.can_desegment > 0 then return nil end
    local all = { f_tcp_seq() }
    local fi = all[#all]
    return fi and fi.value or nil
end

-- The sequence number just past the bytes TCP hands over, where tvb ends with the segment (the
-- segment itself, or its bytes after a reassembled record: no longer than the segment) and
-- tcp.seq has a value; else nil.
local function segment_next_seq(tvb)
    local seqs, lens = { f_tcp_seq() }, { f_tcp_len() }
    local seq, len = seqs[#seqs], lens[#lens]
    if not seq or not len or tvb:reported_len() > len.value then return nil end
    return (seq.value + len.value) % SEQ_MOD
end

-- The state a segment TCP hands over itself (the capture cut it) starts from, TCP having been
-- asked to reassemble the record, or record header, a (asked) that began before it. TCP keeps
-- the record's whole segments, so the segment is placed by sequence numbers where they are known
-- (where the record ends: a.stop); else the record's bytes are counted from those seen, and the
-- end so found is only taken as a record start if a record's magic is there.
local function resume_asked(a, seq)
    local p = a.pend
    if not p then  -- a header's first bytes: kept only where a record was known to start
        if not a.head or (seq and a.at and seq ~= a.at) then
            return { sync = false, quiet = true }
        end
        return { sync = true, head = a.head }
    end
    if seq and a.stop then
        local left = seq_diff(a.stop, seq)
        if left == 0 then return { sync = true } end
        if left < 0 or left > p.total then return { sync = false, quiet = true } end
        return { sync = true, pend = { kind = p.kind, total = p.total, done = p.total - left } }
    end
    return { sync = true, pend = { kind = p.kind, total = p.total, done = p.done, guess = true } }
end

local function copy_state(e)
    return { sync = e.sync, quiet = e.quiet, pend = e.pend, head = e.head }
end

-- the state a direction remembers at sequence number seq, or nil
local function state_known(d, seq)
    return (d.at and d.at[seq]) or (d.old and d.old[seq])
end

local function remember(d, seq, st, overwrite)
    if not overwrite and state_known(d, seq) then return end
    if not d.at or d.kept >= KEEP_STATES then d.old, d.at, d.kept = d.at, {}, 0 end
    if d.at[seq] == nil then d.kept = d.kept + 1 end
    d.at[seq] = st
end

-- The state at sequence number seq of a direction whose running state d ends at d.next, for a
-- segment of wire bytes.
local function state_at(d, seq, wire)
    if seq == nil or d.next == nil or seq == d.next then return copy_state(d) end
    local known = state_known(d, seq)
    if known then return copy_state(known) end
    local gap = seq_diff(seq, d.next)
    -- a segment captured late inside bytes not captured (sent again after the ones that follow
    -- it): where the state at its end is known, and is a record going on since before it, the
    -- segment is that record's
    local after = gap < 0 and state_known(d, (seq + wire) % SEQ_MOD)
    if after and after.pend and not after.pend.guess and after.pend.done > wire then
        local a = after.pend
        return { sync = after.sync, quiet = after.quiet,
            pend = { kind = a.kind, total = a.total, done = a.done - wire } }
    end
    local p = d.pend
    if gap > 0 and p then  -- bytes not captured inside the record going on
        local done = p.done + gap
        if done < p.total then
            return { sync = d.sync, quiet = d.quiet,
                pend = { kind = p.kind, total = p.total, done = done, guess = p.guess } }
        end
        if done == p.total then return { sync = not p.guess, quiet = p.guess } end
    end
    -- after bytes not captured, or inside bytes seen already but not at a segment's edge: where
    -- a record starts is not known
    return { sync = false, quiet = true }
end

-- The state this segment starts from, as a table of its own: sync (a record boundary), quiet (the
-- stretch out of sync has had its expert info), pend (the record going on: kind, total, done
-- bytes), head (the bytes of a record header cut by the end of an earlier segment, no record
-- going on; out of sync, of a possible one); dir (while the state runs) is the direction's
-- running state, seq the segment's sequence number (nil: bytes counted), start a copy of the
-- state it starts from.
local function segment_start(pinfo, conv, len, wire)
    local seq = segment_seq(pinfo)
    local key = direction_key(pinfo)
    local n = pinfo.number
    local dirs
    if pinfo.visited then
        -- placed again only in capture order, as the pass that counted the bytes had the
        -- direction's segments: right after its previous segment, once that one has had all its
        -- calls, or as the next call for the segment placed last
        local done = frame_redo[n]
        local redo = conv.redo and conv.redo[key]
        local again
        if done then
            again = redo and redo.last == n and #done < (frame_calls[n] or 0)
        else
            local prev = frame_prev[n]
            again = prev ~= nil and f_tcp_seq() ~= nil and prev == (redo and redo.last or 0)
                and (not redo or redo.calls == frame_calls[redo.last])
        end
        if not again then
            local e = frame_start[n]
            if done then  -- (a later pass, or a second call for the packet)
                e = done[1]
                for _, x in ipairs(done) do if x.len == len then e = x; break end end
            end
            if not e or e.len ~= len then e = IN_SYNC end
            return copy_state(e)
        end
        conv.redo = conv.redo or {}
        dirs = conv.redo
    else
        conv.dirs = conv.dirs or {}
        dirs = conv.dirs
    end
    local d = dirs[key]
    if not d then d = {}; dirs[key] = d end
    local asked = d.asked
    d.asked = nil
    if pinfo.can_desegment == 0 then
        -- TCP, asked to reassemble a record, hands the next segment over itself: the capture cut
        -- that segment (TCP reassembles no cut segment), so the record goes on in it; TCP keeps
        -- the record's later whole segments, which it cannot complete, to itself
        if asked then
            d.held = asked.pend and true or nil
            asked = resume_asked(asked, seq)
        end
    else
        asked = nil
        if d.held then  -- the first whole segment TCP hands over after them: the record is over
            asked, d.held = { sync = true }, nil
        end
    end
    if pinfo.visited then
        d.calls = d.last == n and d.calls + 1 or 1
    elseif f_tcp_seq() == nil then  -- bytes counted: each of the direction's segments (and its
        -- calls) to be placed again, in capture order
        if d.last ~= n then frame_prev[n] = d.last or 0 end
        frame_calls[n] = (frame_calls[n] or 0) + 1
    end
    d.last = n
    local st = asked or state_at(d, seq, wire)
    local e = copy_state(st)
    e.len = len
    if pinfo.visited then
        frame_redo[n] = frame_redo[n] or {}
        frame_redo[n][#frame_redo[n] + 1] = e
    elseif not st.sync or st.pend or st.head then
        frame_start[pinfo.number] = e
    end
    e = copy_state(st)
    e.dir, e.seq, e.start = d, seq, st
    return e
end

-- After the segment: its direction's running state moves to the segment's end, unless the
-- segment ends at or before it (a retransmission, or one captured late).
local function segment_end(s, len)
    local d, seq = s.dir, s.seq
    local st = copy_state(s)
    d.asked = s.asked
    if not s.going_on then d.held = nil end  -- the record TCP keeps ended in this segment
    if seq == nil then
        -- bytes counted: the direction's next segment is taken to follow this one
        d.sync, d.quiet, d.pend, d.head, d.next = st.sync, st.quiet, st.pend, st.head, nil
        return
    end
    local e = (seq + len) % SEQ_MOD
    remember(d, seq, s.start, false)
    remember(d, e, st, true)
    if d.next == nil or seq_diff(e, d.next) > 0 then
        d.sync, d.quiet, d.pend, d.head, d.next = st.sync, st.quiet, st.pend, st.head, e
    end
end

function proto.init()
    convs = {}
    frame_conv = {}
    frame_start = {}
    frame_redo = {}
    frame_prev = {}
    frame_calls = {}
end

local function current_version(conv)
    local p = proto.prefs.version
    if p ~= 0 then return p, "preference" end
    if conv.version then return conv.version, "detected" end
    return SPEC.versions.default, "default"
end

local function is_supported(v)
    for _, s in ipairs(SPEC.versions.supported) do if s == v then return true end end
    return false
end

-- Layout walker ---------------------------------------------------------------------------------
-- Adds the fields of a layout at off; fills vals/items by field name. Returns the new offset, or
-- nil and the field that did not fit in the tvb.
local function walk(tvb, off, tree, fields, vals, items, ctx)
    for _, fd in ipairs(fields) do
        local size = fd.size
        if type(size) == "string" then size = vals[size] end
        if off + size > tvb:len() then return nil, fd, off end
        local r = at(tvb, off, size)
        local item
        local limit = proto.prefs.bytes_limit
        if fd.type == "bytes" and limit > 0 and size > limit then
            item = tree:add(r, fd.label .. ": " .. size .. " bytes (above the payload field limit)")
        elseif fd.type == "bytes" and size == 0 then  -- not "<MISSING>": nothing was cut
            item = tree:add(r, fd.label .. ": none (0 bytes)")
        else
            item = tree:add_le(F[fd.abbrev], r)
        end
        local v = read_value(fd.type, r)
        -- Wireshark shows a double to 15 significant digits (0.30000000000000004 as 0.3); the
        -- field's value is exact, and so is its text
        if fd.type == "f64" then item:set_text(fd.label .. ": " .. fmt_num(v)) end
        vals[fd.name] = v
        items[fd.name] = item
        if fd.const and v ~= C[fd.const] then
            local args = { got = v, expected = C[fd.const], what = ctx or SPEC.proto.name }
            item:add_proto_expert_info(E[fd.expert], fd.error and errtext(fd.error, args)
                or (fd.name .. " " .. tostring(v) .. " != " .. fd.const .. " " .. C[fd.const]))
            vals._bad = fd.name
        end
        if fd.enum and not fd.lenient and ENUMS[fd.enum].names[v] == nil then
            local args = { value = v, kind = v, got = v }
            item:add_proto_expert_info(E.bad_value, fd.enum_error and errtext(fd.enum_error, args)
                or ("unknown " .. fd.enum .. " " .. tostring(v)))
            vals._bad = vals._bad or fd.name
        end
        if fd.tag then
            item:append_text(" [" .. SPEC.verify_hint .. "]")
            tree:add(field("auth_status"), r, "not verified"):set_generated()
        end
        off = off + size
    end
    return off
end

-- RoundFrame ------------------------------------------------------------------------------------
local HOOK = {}  -- checks the spec states as conditions, keyed by field name

HOOK[SPEC.round_frame_count] = function(v, item, st)
    if v > C.MAX_ROUND_FRAME_TENSORS then
        item:add_proto_expert_info(E.too_large, errtext("frame.too_many_tensors",
            { count = v, cap = C.MAX_ROUND_FRAME_TENSORS }))
        return false
    end
    return true
end
HOOK.weight = function(v, item, st)
    if v ~= v or v == math.huge or v < 0 then
        local text = rust_display(v)
        item:add_proto_expert_info(E.bad_value, errtext("frame.bad_weight", { weight = text }))
    end
    return true
end
HOOK.nbytes = function(v, item, st, tv)
    st.total = st.total + v
    if st.total > proto.prefs.ceiling then
        item:add_proto_expert_info(E.too_large, errtext("frame.past_ceiling",
            { index = tv.index, ceiling = proto.prefs.ceiling, nbytes = v, total = st.total }))
        return false
    end
    return true
end

-- The tree shows at most TREE_TENSORS tensors of a frame and TREE_DIMS dims of a tensor (Wireshark
-- stops a packet at a million tree items: 4000 tensors of 255 dims would pass it). The rest are
-- read and checked all the same, into NULL_TREE, which takes every call and shows nothing.
local TREE_TENSORS, TREE_DIMS = 1000, 16
local NULL_TREE = setmetatable({}, { __index = function(t) return function() return t end end })

-- after a tensor's parts: shape, element count, nbytes vs shape, first values
local function tensor_done(tvb, ttree, tv, items, st)
    local dims = tv.dims
    local numel = 1
    for _, d in ipairs(dims) do numel = numel * d end
    local shape = fmt_list(dims):gsub(",", ", ")
    local dname = ENUMS.Dtype.names[tv.dtype] or ("unknown(" .. tostring(tv.dtype) .. ")")
    ttree:add(field("round_frame.shape"), at(tvb, tv.start), shape):set_generated()
    if numel >= 2 ^ 64 then  -- UInt64 would show it wrapped (0 for 2^64)
        local big = string.format("%.4g", numel)
        local item = ttree:add(at(tvb, tv.start), "Elements: " .. big
            .. " (the product of the dims) overflows u64")
        item:set_generated()
        item:add_proto_expert_info(E.bad_value, "element count " .. big
            .. " (the product of the dims) overflows u64")
    else
        ttree:add(field("round_frame.numel"), at(tvb, tv.start), UInt64(numel)):set_generated()
    end
    local es = ENUMS.Dtype.element_size[tv.dtype]
    local nb = tv.nbytes
    local elided = nb == 0 and numel > 0
    if es == nil then
        items.dtype:add_proto_expert_info(E.lenient, "unknown dtype tag " .. tostring(tv.dtype)
            .. " (0 = f32, 1 = bf16): accepted by the reader, rejected by the fold")
    elseif elided then
        ttree:add(field("round_frame.elided"), at(tvb, tv.start), 1):set_generated()
        if st.version < 3 then
            items.nbytes:add_proto_expert_info(E.version, "elided payload (nbytes 0, " .. numel
                .. " elements) is not legal at protocol version " .. st.version
                .. " (the fold rejects it)")
        end
    elseif nb ~= numel * es then
        items.nbytes:add_proto_expert_info(E.nbytes_shape, errtext("tensor.nbytes_vs_shape",
            { shape = shape, expected = numel * es, got = nb }))
    elseif numel > 0 and ttree ~= NULL_TREE then  -- (values of a tensor the tree shows)
        local n = math.min(numel, SPEC.preview_values)
        local vals = {}
        local member = ENUMS.Dtype.members[tv.dtype]
        local dec, bits = ELEMENT[member], ELEMENT_BITS[member]
        for i = 0, n - 1 do vals[#vals + 1] = fmt_num(dec(tvb(tv.data_off + i * es, es)), bits) end
        local text = "[" .. table.concat(vals, ", ") .. (numel > n and ", …]" or "]")
        ttree:add(field("round_frame.values"), at(tvb, tv.data_off, nb), text):set_generated()
    end
    ttree:set_text(string.format("Tensor %d: %s%s, %s%s", tv.index, dname, shape, fmt_bytes(nb),
        elided and " (elided)" or ""))
    st.tensors[#st.tensors + 1] = { dtype = dname, shape = dims, nbytes = nb }
end


-- Dissect the RoundFrame occupying tvb[off, tvb:len()). Returns a summary table; summary.bad is
-- set when the frame is malformed.
local function dissect_frame(tvb, off, tree, version)
    local st = { total = 0, tensors = {}, version = version, vals = {} }
    local vals, items = st.vals, {}
    local parts = SPEC.round_frame
    local p = off
    local function truncated(part, at_off, need)
        tree:add_proto_expert_info(E.truncated, errtext(part.truncated_error or "frame.kind_read_failed",
            { offset = at_off - off, index = #st.tensors, got = tvb:len() - at_off, need = need }))
        st.bad = "truncated"
        return st
    end
    local i = 1
    while i <= #parts do
        local part = parts[i]
        if part.group == "once" then
            local np, fd, fo = walk(tvb, p, tree, part.fields, vals, items, "frame")
            if not np then return truncated(part, fo, fd.size) end
            if vals._bad then st.bad = vals._bad; return st end
            for _, fd in ipairs(part.fields) do
                local h = HOOK[fd.name]
                if h and not h(vals[fd.name], items[fd.name], st) then st.bad = fd.name; return st end
            end
            p = np
            i = i + 1
        else
            local j = i
            while j <= #parts and parts[j].group == part.group do j = j + 1 end
            local count = vals[part.count]
            for t = 0, count - 1 do
                local tstart = p
                local ttree = NULL_TREE
                if t < TREE_TENSORS then
                    ttree = tree:add(field("round_frame.tensor"), at(tvb, p, 1), t)
                end
                local tv, titems = { index = t, start = p, dims = {} }, {}
                for k = i, j - 1 do
                    local q = parts[k]
                    local times = 1
                    if q.times then times = tv[q.times] end
                    for rep = 1, times do
                        if q.data then tv.data_off = p end
                        local into = (q.times and rep > TREE_DIMS) and NULL_TREE or ttree
                        local np, fd, fo = walk(tvb, p, into, q.fields, tv, titems, "frame")
                        if not np then
                            ttree:set_len(math.max(1, math.min(p, tvb:len()) - tstart))
                            local need = fd.size
                            if type(need) == "string" then need = tv[need] end
                            return truncated(q, fo, need)
                        end
                        for _, fd in ipairs(q.fields) do
                            local h = HOOK[fd.name]
                            if h and not h(tv[fd.name], titems[fd.name], st, tv) then
                                st.bad = fd.name
                                if ttree == NULL_TREE then  -- its expert info went nowhere
                                    tree:add_proto_expert_info(E.bad_value, "tensor " .. t
                                        .. " (past the tree's first " .. TREE_TENSORS
                                        .. "): " .. fd.name .. " refused")
                                end
                                return st
                            end
                        end
                        if q.times then tv.dims[#tv.dims + 1] = tv[q.fields[1].name] end
                        p = np
                    end
                end
                if p > tstart then ttree:set_len(p - tstart) end
                if #tv.dims > TREE_DIMS then
                    ttree:add(at(tvb, tstart), (#tv.dims - TREE_DIMS)
                        .. " more dims not shown (see Shape)"):set_generated()
                end
                tensor_done(tvb, ttree, tv, titems, st)
            end
            if count > TREE_TENSORS then
                tree:add(at(tvb, off), (count - TREE_TENSORS) .. " more tensors not shown in the "
                    .. "tree (read and checked; flodl-proto decode lists them)"):set_generated()
            end
            i = j
        end
    end
    st.length = p - off
    if p < tvb:len() then
        tree:add(field("round_frame.trailing"), tvb(p), tvb:len() - p):add_proto_expert_info(
            E.trailing, count_bytes(tvb:len() - p)
            .. " after the RoundFrame (ignored by the reader)")
    end
    tree:add(field("round_frame.total_nbytes"), at(tvb, off), UInt64(st.total)):set_generated()
    st.kind = ENUMS.RoundKind.names[vals.kind]
    st.weight = vals.weight
    return st
end

local function frame_info(st)
    if st.bad then return "malformed RoundFrame (" .. st.bad .. ")" end
    return string.format("%s w=%s %d tensor%s %s", st.kind, fmt_num(st.weight), #st.tensors,
        #st.tensors == 1 and "" or "s", fmt_bytes(st.total))
end

-- Bincode (RelayControlMsg) ---------------------------------------------------------------------
local WIDTH = { [M.u16] = 2, [M.u32] = 4, [M.u64] = 8, [M.u128] = 16 }
local MAX_WIDTH = { u8 = 1, u16 = 2, u32 = 4, u64 = 8 }
local MARKER_NAME = { [M.u16] = "u16", [M.u32] = "u32", [M.u64] = "u64", [M.u128] = "u128" }

-- nil when s is valid UTF-8, else a description of the first invalid byte
local function utf8_error(s)
    local i, n = 1, #s
    while i <= n do
        local c = s:byte(i)
        local len, min
        if c < 0x80 then len, min = 1, 0
        elseif c >= 0xC2 and c <= 0xDF then len, min = 2, 0x80
        elseif c >= 0xE0 and c <= 0xEF then len, min = 3, 0x800
        elseif c >= 0xF0 and c <= 0xF4 then len, min = 4, 0x10000
        else return string.format("invalid byte 0x%02x at index %d", c, i - 1) end
        if i + len - 1 > n then return string.format("incomplete sequence at index %d", i - 1) end
        local cp = len == 1 and c or (c % (2 ^ (7 - len)))
        for k = 1, len - 1 do
            local cc = s:byte(i + k)
            if cc < 0x80 or cc > 0xBF then
                return string.format("invalid continuation byte at index %d", i + k - 1)
            end
            cp = cp * 64 + (cc - 0x80)
        end
        if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then
            return string.format("invalid code point at index %d", i - 1)
        end
        i = i + len
    end
    return nil
end

local function bc_fail(id, args) error({ id = id, args = args }, 0) end

local function varint(tvb, p, limit, ty, fname, base_off)
    if p >= limit then
        bc_fail("bincode.unexpected_end", { field = fname, offset = p - base_off, need = 1 })
    end
    local b = tvb(p, 1):uint()
    if b <= M.single_byte_max then return b, p + 1 end
    local w = WIDTH[b]
    if w == nil or w > MAX_WIDTH[ty] then
        bc_fail("bincode.invalid_integer_type", { expected = ty, found = MARKER_NAME[b] or
            string.format("marker 0x%02x", b), field = fname, offset = p - base_off })
    end
    if p + 1 + w > limit then
        bc_fail("bincode.unexpected_end", { field = fname, offset = p - base_off,
            need = p + 1 + w - limit })
    end
    local v
    if w <= 4 then v = tvb(p + 1, w):le_uint() else v = tvb(p + 1, w):le_uint64():tonumber() end
    return v, p + 1 + w
end

-- decode one value of type descriptor ty; adds items under tree when given. name: the field as
-- errors name it ("Hello.ranks"; its length prefix "Hello.ranks length"), as the codec does
local function bc_value(tvb, p, limit, ty, fd, tree, base_off, name)
    if ty.kind == "uint" then
        local v, np = varint(tvb, p, limit, ty.type, name, base_off)
        if tree then tree:add(F[fd.abbrev], tvb(p, np - p), v) end
        return v, np
    elseif ty.kind == "string" then
        local n, q = varint(tvb, p, limit, "u64", name .. " length", base_off)
        if q + n > limit then
            bc_fail("bincode.unexpected_end", { field = name, offset = q - base_off,
                need = q + n - limit })
        end
        local s = n > 0 and tvb(q, n):raw() or ""
        local bad = utf8_error(s)
        if bad then
            bc_fail("bincode.invalid_utf8", { reason = bad, field = name, offset = q - base_off })
        end
        if tree then
            if n > 0 then tree:add_packet_field(F[fd.abbrev], tvb(q, n), ENC_UTF_8)
            else tree:add(F[fd.abbrev], at(tvb, p, q - p), "") end
        end
        return s, q + n
    elseif ty.kind == "array" then
        if p + ty.len > limit then
            bc_fail("bincode.unexpected_end", { field = name, offset = p - base_off,
                need = p + ty.len - limit })
        end
        if tree then tree:add(F[fd.abbrev], tvb(p, ty.len)) end
        return tvb(p, ty.len):bytes():tohex(), p + ty.len
    elseif ty.kind == "vec" then
        local n, q = varint(tvb, p, limit, "u64", name .. " length", base_off)
        -- an empty sequence is its count alone: an item over it, as an empty payload has one
        if tree and n == 0 then
            tree:add(tvb(p, q - p), LABEL[fd.abbrev] .. ": none (0 entries)")
        end
        local out = {}
        for k = 1, n do
            local v
            v, q = bc_value(tvb, q, limit, ty.elem, fd, tree, base_off, name)
            out[k] = v
        end
        return out, q
    end
end

-- decode a RelayControlMsg at protocol version `version`; raises {id, args} on failure
local function bc_message(tvb, p0, limit, tree, version)
    local idx, p = varint(tvb, p0, limit, "u32", "variant", p0)
    local var = SPEC.variants[idx]
    if var == nil then
        local count = 0
        for _ in pairs(SPEC.variants) do count = count + 1 end
        bc_fail("bincode.invalid_variant", { value = idx, count = count })
    end
    if tree then tree:add(field("relay_control_msg.variant"), tvb(p0, p - p0), idx) end
    local values = {}
    for _, fd in ipairs(var.fields) do
        local present = false
        for _, v in ipairs(fd.versions) do if v == version then present = true end end
        if present then values[fd.name], p = bc_value(tvb, p, limit, fd.type, fd, tree, p0,
            var.name .. "." .. fd.name) end
    end
    return { index = idx, var = var, values = values, endp = p }
end

-- the versions in which a decode of tvb[p0, limit) consumes it exactly (detection)
local function bc_detect(tvb, p0, limit)
    local exact = nil
    local vs = SPEC.versions.supported
    for k = #vs, 1, -1 do
        local ok, res = pcall(bc_message, tvb, p0, limit, nil, vs[k])
        if ok and res.endp == limit then
            local differs = false
            for _, fd in ipairs(res.var.fields) do
                if #fd.versions < #vs then differs = true end
            end
            if differs then exact = vs[k] end
            break
        end
    end
    return exact
end

local FIXED = {
    channel_magic = C.CHANNEL_MAGIC_LEN,
    handshake = C.HANDSHAKE_LEN,
    handshake_ack = C.HANDSHAKE_ACK_LEN,
}

-- Record dissectors -----------------------------------------------------------------------------
local REC = {}

local function new_record(tvb, tree, kind, direction)
    local rtree = tree:add(proto, tvb())
    rtree:add(field("kind"), at(tvb, 0, tvb:len()), kind):set_generated()
    if direction and direction ~= "" then
        rtree:add(field("direction"), at(tvb, 0, tvb:len()), direction):set_generated()
    end
    return rtree
end

local function add_ranks(rtree, tvb, ranks)
    for _, r in ipairs(ranks or {}) do
        rtree:add(field("rank"), at(tvb, 0, tvb:len()), r):set_generated()
    end
end

-- The whole record's length while a record that goes on past its segment (no TCP reassembly) is
-- dissected: cut by its tvb's end, it is not truncated but continued.
local continuing = nil
-- The same for a record whose bytes the capture cut (a packet longer than the capture's snaplen):
-- the record is whole on the wire, but its bytes past the packet's captured length are not in
-- the capture.
local uncaptured = nil

-- A record cut by its tvb's end: truncated (an error), or, while `continuing`, a note of how much
-- of it this segment holds, or, while `uncaptured`, an item saying how much the capture kept (the
-- packet's warning says why). Returns the Info text's suffix.
local function cut(rtree, tvb, text)
    if uncaptured then
        rtree:add(at(tvb, 0, tvb:len()), string.format("Record cut by the capture: %d of its %d "
            .. "bytes captured (the capture's snaplen)", tvb:len(), uncaptured)):set_generated()
        return " (cut by the capture)"
    end
    if continuing then
        rtree:add_proto_expert_info(E.continued, string.format("record continues in the next "
            .. "segments: %d of its %d bytes here (not reassembled)", tvb:len(), continuing))
        return " (continues)"
    end
    rtree:add_proto_expert_info(E.truncated, text)
    return " truncated"
end

local function add_version(rtree, tvb, conv)
    local v, how = current_version(conv)
    rtree:add(field("version"), at(tvb, 0, tvb:len()), v):append_text(" (" .. how .. ")")
    return v
end

function REC.channel_magic(tvb, pinfo, tree, conv)
    local R = SPEC.records.channel_magic
    local rtree = new_record(tvb, tree, R.kind, R.direction)
    local vals, items = {}, {}
    if not walk(tvb, 0, rtree, LAYOUTS.channel_magic, vals, items, "cluster_controller") then
        return R.kind .. cut(rtree, tvb, errtext(R.truncated_error,
            { what = "cluster_controller", got = tvb:len(), need = C.CHANNEL_MAGIC_LEN }))
    end
    local name = ENUMS.Channel.names[vals.magic] or string.format("0x%08x", vals.magic)
    if vals.magic ~= C.CHANNEL_MAGIC_DATA then
        items.magic:add_proto_expert_info(E.bad_magic, errtext("channel.bad_magic",
            { what = "cluster_controller", got = vals.magic, expected = C.CHANNEL_MAGIC_DATA }))
    end
    if not pinfo.visited then conv.leg = "mux"; conv.relay_port = pinfo.src_port end
    local info = R.kind .. " " .. name .. " " .. R.direction
    rtree:append_text(", " .. info)
    return info
end

local function handshake_like(name, tvb, pinfo, tree, conv)
    local R = SPEC.records[name]
    local rtree = new_record(tvb, tree, R.kind, R.direction)
    local vals, items = {}, {}
    if not walk(tvb, 0, rtree, LAYOUTS[name], vals, items, "cluster_controller") then
        return R.kind .. " " .. R.direction .. cut(rtree, tvb, errtext(R.truncated_error,
            { got = tvb:len(), need = FIXED[name] }))
    end
    local v = vals.version
    local pref = proto.prefs.version
    local err = name == "handshake" and "handshake.bad_version" or "ack.bad_version"
    if not is_supported(v) then
        items.version:add_proto_expert_info(E.version, "protocol version " .. tostring(v)
            .. " is not supported (supported: " .. table.concat(SPEC.versions.supported, ", ")
            .. ")")
    elseif pref ~= 0 and v ~= pref then
        items.version:add_proto_expert_info(E.version, errtext(err, { got = v, expected = pref }))
    end
    if not pinfo.visited then
        conv.leg = "loopback"
        if is_supported(v) then conv.version = v end
        if name == "handshake" then
            conv.rank_port = pinfo.src_port
            conv.ranks = { vals.rank }
        else
            conv.relay_port = pinfo.src_port
        end
    end
    local info = R.kind .. " " .. R.direction
    if name == "handshake" then
        add_ranks(rtree, tvb, { vals.rank })
        info = info .. string.format(" rank %d world %d", vals.rank, vals.world_size)
    end
    info = info .. " v" .. tostring(v)
    rtree:append_text(", " .. info)
    return info
end
function REC.handshake(tvb, pinfo, tree, conv) return handshake_like("handshake", tvb, pinfo, tree, conv) end
function REC.handshake_ack(tvb, pinfo, tree, conv) return handshake_like("handshake_ack", tvb, pinfo, tree, conv) end

local function loop_direction(pinfo, conv)
    local R = SPEC.records.len_framed
    if conv.rank_port then
        if pinfo.src_port == conv.rank_port then return R.rank_to_relay end
        return R.relay_to_rank
    end
    if conv.relay_port then
        if pinfo.src_port == conv.relay_port then return R.relay_to_rank end
        return R.rank_to_relay
    end
    return R.direction
end

function REC.len_framed(tvb, pinfo, tree, conv)
    local R = SPEC.records.len_framed
    local direction = loop_direction(pinfo, conv)
    local rtree = new_record(tvb, tree, R.kind, direction)
    if not pinfo.visited then conv.leg = "loopback" end
    local version = add_version(rtree, tvb, conv)
    local vals, items = {}, {}
    local np = walk(tvb, 0, rtree, LAYOUTS.len_framed, vals, items)
    add_ranks(rtree, tvb, conv.ranks)
    local info = R.kind .. " " .. direction
    if conv.ranks then info = info .. " rank " .. fmt_list(conv.ranks) end
    if not np then  -- cut by its tvb's end: still names the connection's rank
        return info .. cut(rtree, tvb, loopback_errtext("len.body_read_failed",
            { got = tvb:len() - 4, need = vals.length or 4 }))
    end
    local body = tvb(4, vals.length):tvb()
    if vals.length < 4 or u32(body, 0) ~= C.ROUND_FRAME_MAGIC then
        items.body:add_proto_expert_info(E.bad_magic, errtext("frame.bad_magic",
            { got = vals.length >= 4 and u32(body, 0) or 0, expected = C.ROUND_FRAME_MAGIC }))
        info = info .. " (not a RoundFrame)"
        rtree:append_text(", " .. info)
        return info
    end
    local st = dissect_frame(body, 0, items.body, version)
    info = info .. " " .. frame_info(st)
    rtree:append_text(", " .. info)
    return info
end

-- An unknown mux record kind is named by its byte, "0xff": its record's flodl.kind and the
-- flodl.continuation of its bytes in later segments.
local UNKNOWN_KIND = "0x%02x"

-- How the Info column and the tree name a record type: an unknown mux record kind as
-- "0xff (unknown kind)", in its record's first segment and in the segments that continue it.
local function kind_label(kname)
    if kname:match("^0x%x%x$") then return kname .. " (unknown kind)" end
    return kname
end

function REC.mux_record(tvb, pinfo, tree, conv)
    local vals, items = {}, {}
    local kind = tvb(8, 1):uint()
    local kname = ENUMS.RecordKind.names[kind] or string.format(UNKNOWN_KIND, kind)
    local direction = ENUMS.RecordKind.direction[kind] or ""
    local rtree = new_record(tvb, tree, kname, nil)
    if not pinfo.visited then conv.leg = "mux" end
    local version = current_version(conv)
    local members = ENUMS.RecordKind.members
    local m = members[kind]
    local np = walk(tvb, 0, rtree, LAYOUTS.mux_record, vals, items, "relay_mux")
    if not np then
        -- a record cut by its tvb's end (going on in the next segments, cut by the capture, or
        -- truncated) names the ranks it concerns as a whole one does: a Data record its rank
        -- (its header is whole: the record was framed from it), a HostFrame or Broadcast the
        -- connection's
        local info = m and (kname .. " " .. direction) or kind_label(kname)
        if m == "DATA" and vals.rank ~= nil then
            add_ranks(rtree, tvb, { vals.rank })
            info = info .. " rank " .. vals.rank
        elseif (m == "HOST_FRAME" or m == "BROADCAST") and conv.ranks then
            add_ranks(rtree, tvb, conv.ranks)
            info = info .. " ranks " .. fmt_list(conv.ranks)
        end
        info = info .. cut(rtree, tvb, errtext("mux.truncated",
            { got = tvb:len(), need = 25 + (vals.payload_len or 0) }))
        rtree:add(field("direction"), at(tvb, 0), direction):set_generated()
        return info
    end
    local info
    local payload_off = tvb:len() - vals.payload_len
    if m == "DATA" then
        add_ranks(rtree, tvb, { vals.rank })
        info = string.format("%s %s rank %d %s", kname, direction, vals.rank,
            fmt_bytes(vals.payload_len))
    elseif m == "CONTROL" then
        local limit = tvb:len()
        if proto.prefs.version == 0 and not pinfo.visited then
            local det = bc_detect(tvb, payload_off, limit)
            if det then conv.version = det end
        end
        version = current_version(conv)
        local ok, res = pcall(bc_message, tvb, payload_off, limit, items.payload, version)
        if not ok then
            if type(res) ~= "table" then error(res, 0) end
            local grp = res.id == "bincode.unexpected_end" and E.truncated or E.bad_value
            items.payload:add_proto_expert_info(grp, errtext(res.id, res.args))
            info = kname .. " " .. direction .. " (bincode error)"
        else
            direction = res.var.direction ~= "" and res.var.direction or direction
            local v = res.values
            info = string.format("%s %s %s", kname, res.var.name, direction)
            if v.host then info = info .. " host " .. v.host end
            if v.ranks then
                add_ranks(rtree, tvb, v.ranks)
                info = info .. " ranks " .. fmt_list(v.ranks)
                if not pinfo.visited then conv.ranks = v.ranks; conv.host = v.host end
            end
            if v.rank then
                add_ranks(rtree, tvb, { v.rank })
                info = info .. " rank " .. v.rank
            end
            if v.model_sigs then info = info .. " model_sigs " .. #v.model_sigs end
            if res.endp < limit then
                items.payload:add_proto_expert_info(E.trailing, count_bytes(limit - res.endp)
                    .. " after the message (ignored by the reader)")
            end
        end
    elseif m == "HOST_FRAME" or m == "BROADCAST" then
        add_ranks(rtree, tvb, conv.ranks)
        info = kname .. " " .. direction
        if conv.ranks then info = info .. " ranks " .. fmt_list(conv.ranks) end
        local body = tvb(payload_off, vals.payload_len):tvb()
        local st = dissect_frame(body, 0, items.payload, version)
        info = info .. " " .. frame_info(st)
    else
        info = kind_label(kname)
    end
    rtree:add(field("direction"), at(tvb, 0), direction):set_generated()
    add_version(rtree, tvb, conv)
    rtree:append_text(", " .. info)
    return info
end

-- Framing ---------------------------------------------------------------------------------------
local START = {}  -- first u32 of a record -> record name
START[C.MUX_RECORD_MAGIC] = "mux_record"
START[C.HANDSHAKE_MAGIC_RANK] = "handshake"
START[C.HANDSHAKE_MAGIC_CONTROLLER_ACK] = "handshake_ack"
for code, _ in pairs(ENUMS.Channel.names) do START[code] = "channel_magic" end


-- A mux record named by its header as the Info column names it: "(kind=0x03 HostFrame relay→ctl
-- ranks [0,1])" (a HostFrame or Broadcast: the ranks the connection's Hello announced, if seen),
-- "(kind=0x01 Data relay↔ctl rank 2)", "(kind=0x02 Control relay↔ctl)"; an unknown kind keeps
-- the header's rank.
local function mux_who(kind, rank, conv)
    local m = ENUMS.RecordKind.members[kind]
    local text = string.format("kind=0x%02x", kind)
    if m == nil then return "(" .. text .. string.format(", rank=%d)", rank) end
    text = text .. " " .. ENUMS.RecordKind.names[kind]
    local direction = ENUMS.RecordKind.direction[kind] or ""
    if direction ~= "" then text = text .. " " .. direction end
    if m == "DATA" then
        text = text .. " rank " .. rank
    elseif (m == "HOST_FRAME" or m == "BROADCAST") and conv.ranks then
        text = text .. " ranks " .. fmt_list(conv.ranks)
    end
    return "(" .. text .. ")"
end

-- Returns name, total length; or name, total length, reason, expert (a record whose length is
-- above the ceiling: reported, not dissected); or nil, bytes still needed
-- (DESEGMENT_ONE_MORE_SEGMENT when unknown); or false, nil, reason, expert (cannot be framed: the
-- rest of the segment is malformed). Out of sync (`sync` false: no record start seen yet in this
-- direction, or malformed bytes since), a loopback record is known by its RoundFrame magic, as
-- on an unknown leg, not by a length alone.
local function frame_pdu(tvb, off, conv, sync)
    local avail = tvb:len() - off
    if avail < 4 then return nil, DESEGMENT_ONE_MORE_SEGMENT end
    local m = u32(tvb, off)
    local name = START[m]
    if name == "mux_record" then
        -- the record's length is in the header: until it is whole, ask for one more segment
        if avail < C.MUX_HEADER_LEN then return nil, DESEGMENT_ONE_MORE_SEGMENT end
        local plen = u32(tvb, off + 13)
        if plen > proto.prefs.ceiling then
            local kind, rank = tvb(off + 8, 1):uint(), u32(tvb, off + 9)
            local why = errtext("mux.payload_too_large", { length = plen,
                ceiling = proto.prefs.ceiling, kind = kind, rank = rank })
            -- the reader's "(kind=.., rank=..)" names the header's rank, which only a Data record
            -- fills (0 otherwise): the record is named as its tree item would be instead
            local raw = string.format("(kind=0x%02x, rank=%d)", kind, rank)
            local i = why:find(raw, 1, true)
            if i then why = why:sub(1, i - 1) .. mux_who(kind, rank, conv) .. why:sub(i + #raw) end
            return name, C.MUX_HEADER_LEN + plen, why, E.too_large
        end
        return name, C.MUX_HEADER_LEN + plen
    elseif name then
        return name, FIXED[name]
    end
    local framed = sync and conv.leg == "loopback"
    local magic = false  -- the RoundFrame magic follows the length
    if conv.leg ~= "mux" and avail >= 8 then magic = u32(tvb, off + 4) == C.ROUND_FRAME_MAGIC end
    if not framed and conv.leg ~= "mux" then
        if avail < 8 then return nil, DESEGMENT_ONE_MORE_SEGMENT end
        framed = magic
    end
    if framed then
        if m > proto.prefs.ceiling then
            local why = loopback_errtext("len.too_large",
                { length = m, ceiling = proto.prefs.ceiling })
            -- a length above the ceiling is taken as the record's only when a RoundFrame follows
            -- (four bytes that are not a length would otherwise hide up to 4 GiB of the stream)
            if magic then return "len_framed", C.LEN_PREFIX_LEN + m, why, E.too_large end
            return false, nil, why, E.too_large
        end
        return "len_framed", C.LEN_PREFIX_LEN + m
    end
    local expected = conv.leg == "mux" and "mux.bad_magic" or "frame.bad_magic"
    local exp_val = conv.leg == "mux" and C.MUX_RECORD_MAGIC or C.ROUND_FRAME_MAGIC
    return false, nil, errtext(expected, { got = m, expected = exp_val }), E.bad_magic
end

-- The record type of the record starting at off (framed as name): an unknown mux record kind
-- is its byte ("0xff", the flodl.kind of its record).
local function record_kind(tvb, off, name)
    if name == "mux_record" then
        local k = tvb(off + 8, 1):uint()
        return ENUMS.RecordKind.names[k] or string.format(UNKNOWN_KIND, k)
    end
    return SPEC.records[name].kind
end

-- The start of a segment that continues the record s.pend: shown as its continuation. wire: the
-- segment's length on the wire (above tvb:len() when the capture cut the packet). Returns the
-- offset after the record's bytes in the segment (past tvb:len() when the capture cut them).
local function add_continuation(tvb, tree, s, infos, wire)
    local p = s.pend
    local w = math.min(p.total - p.done, wire)
    local n = math.min(w, tvb:len())
    local rtree = tree:add(proto, tvb(0, n))
    rtree:add(field("continuation"), tvb(0, n), p.kind):set_generated()
    rtree:append_text(string.format(", continuation of %s (bytes %d to %d of %d)",
        kind_label(p.kind), p.done + 1, p.done + w, p.total))
    if n < w then
        rtree:append_text(string.format(", %d of them captured", n))
    end
    infos[#infos + 1] = "[continuation of " .. kind_label(p.kind) .. "]"
    s.pend = nil
    if p.done + w < p.total then
        s.pend = { kind = p.kind, total = p.total, done = p.done + w, guess = p.guess }
        s.going_on = true
    elseif p.guess then
        -- where the record ends was counted past bytes TCP may have kept: what follows is read
        -- as after bytes out of sync, from the next record start
        s.sync, s.quiet = false, true
    end
    return w
end

-- A record header cut by the capture (the packet is longer than the capture's snaplen): where the
-- records after it start is not known, so the direction is out of sync (without a warning of its
-- own: the packet's says why).
local function add_uncaptured_head(r, tree, s, infos)
    local rtree = tree:add(proto, r)
    rtree:add(field("kind"), r, "Header"):set_generated()
    rtree:append_text(string.format(", record header cut by the capture (%d bytes captured)",
        r:len()))
    infos[#infos + 1] = "[record header, cut by the capture]"
    s.sync, s.quiet, s.head = false, true, nil
end

-- A packet the capture cut (its snaplen): an item for the bytes not captured, with a warning on
-- the direction's first such packet (recorded on the first pass, so later passes show it on the
-- same packet).
local function add_uncaptured(tvb, pinfo, tree, conv, infos, wire)
    local len = tvb:len()
    local key = direction_key(pinfo)
    conv.snapped = conv.snapped or {}
    if not pinfo.visited and conv.snapped[key] == nil then conv.snapped[key] = pinfo.number end
    local rtree = tree:add(proto, at(tvb, len))
    local item = rtree:add(field("uncaptured"), at(tvb, len), wire - len)
    rtree:append_text(string.format(", %d of the segment's %d bytes not captured (the "
        .. "capture's snaplen)", wire - len, wire))
    if conv.snapped[key] == pinfo.number then
        item:add_proto_expert_info(E.snaplen, string.format("packet cut by the capture: %d of "
            .. "the segment's %d bytes captured; the records in this direction's cut packets are "
            .. "incomplete or not shown (take the capture with a full snaplen: tcpdump -s 0)",
            len, wire))
    end
    infos[#infos + 1] = string.format("[%d bytes not captured]", wire - len)
end

-- A record header cut by the end of its segment (range r), without reassembly: kept (s.head) to
-- be completed from the direction's next segment. before: bytes of it in earlier segments.
local function add_head(r, tree, s, infos, before)
    local rtree = tree:add(proto, r)
    rtree:add(field("kind"), r, "Header"):set_generated()
    local n = #before + r:len()
    rtree:add_proto_expert_info(E.continued, string.format("record header continues in the next "
        .. "segment: %d of its bytes so far (not reassembled)", n))
    rtree:append_text(string.format(", record header cut by the segment's end (%d bytes so far)",
        n))
    infos[#infos + 1] = "[record header, continues]"
    s.head = before .. r:raw()
end

-- Out of sync, bytes too few to tell whether a record starts at them (range r, the segment's last;
-- a record's magic takes 4 bytes, a loopback length and the RoundFrame magic after it 8), without
-- reassembly: kept (s.head, out of sync) to be read with the direction's next segment's bytes.
-- before: bytes of them in earlier segments.
local function add_maybe_head(r, tree, s, infos, before)
    local rtree = tree:add(proto, r)
    rtree:add(field("kind"), r, "Header"):set_generated()
    local text = string.format("possible record header: %d bytes out of sync, too few to tell "
        .. "whether a record starts here (read with the next segment's)", #before + r:len())
    rtree:add_proto_expert_info(E.continued, text)
    rtree:append_text(", " .. text)
    infos[#infos + 1] = "[possible record header]"
    s.head = before .. r:raw()
end

-- Bytes that cannot be dissected (range r): one Malformed item with the expert info grp, why.
local function add_malformed(r, tree, grp, why, infos)
    local rtree = tree:add(proto, r)
    rtree:add(field("kind"), r, "Malformed"):set_generated()
    rtree:add_proto_expert_info(grp, why)
    rtree:append_text(", " .. why)
    infos[#infos + 1] = "Malformed: " .. why
end

-- The start of a segment that completes the record header s.head: the header is framed from its
-- bytes and this segment's, and the record (as far as this segment goes) is dissected from a
-- buffer holding both (a data source of its own); its bytes in the next segments are its
-- continuation. Returns the offset after the record's bytes in this segment (past tvb:len() when
-- the capture cut them: wire is the segment's length on the wire). Out of sync (s.head kept as a
-- possible record header), a record starts at the bytes kept only if they and this segment's
-- begin one; else the segment is read on its own (returns 0).
local function complete_head(tvb, pinfo, tree, conv, s, infos, wire)
    local head, len = s.head, tvb:len()
    s.head = nil
    local k = math.min(len, C.MUX_HEADER_LEN)
    local htvb = ByteArray.new(head .. tvb:raw(0, k), true):tvb("flodl record header")
    local name, n, why, grp = frame_pdu(htvb, 0, conv, s.sync)
    if not s.sync then
        local magic = #head + k >= 4 and START[u32(htvb, 0)]
        if name == nil and not magic and wire == len then  -- still too few to tell
            add_maybe_head(tvb(), tree, s, infos, head)
            return len
        elseif not name and not (name == nil and magic) then
            return 0
        end
        s.sync, s.quiet = true, nil
    end
    if name == nil and wire > len then
        add_uncaptured_head(tvb(), tree, s, infos)
        return len
    elseif name == nil then  -- still short of a header: all of this segment is more of it
        add_head(tvb(), tree, s, infos, head)
        return len
    elseif name == false then
        add_malformed(tvb(), tree, grp, why, infos)
        s.sync, s.quiet = false, true
        return len
    elseif FIXED[name] and #head + len < n and wire == len then
        -- a channel magic, handshake or ack, read whole: all of this segment is more of it
        add_head(tvb(), tree, s, infos, head)
        return len
    end
    local have = math.max(0, math.min(n - #head, len))
    local onwire = math.max(0, math.min(n - #head, wire))  -- captured or not
    local kind = record_kind(htvb, 0, name)
    local bytes = (have > 0 and (head .. tvb:raw(0, have)) or head):sub(1, n)
    local rtvb = ByteArray.new(bytes, true):tvb("flodl " .. kind .. " record")
    if why then
        add_malformed(rtvb(), tree, grp, why, infos)
    else
        if have < onwire then uncaptured = n elseif #head + have < n then continuing = n end
        infos[#infos + 1] = REC[name](rtvb, pinfo, tree, conv)
        continuing, uncaptured = nil, nil
    end
    if #head + onwire < n then s.pend = { kind = kind, total = n, done = #head + onwire } end
    return onwire
end

-- Bytes out of sync that start no record: skipped, the first stretch's first with a warning.
local function add_skipped(tvb, off, tree, s, infos)
    local n = tvb:len() - off
    local rtree = tree:add(proto, tvb(off))
    local item = rtree:add(field("skipped"), tvb(off), n)
    if not s.quiet then
        item:add_proto_expert_info(E.no_record_start, "no record starts here: the capture began "
            .. "inside a record, or these bytes are not flodl's (skipped until a segment starts "
            .. "a record)")
        s.quiet = true
    end
    rtree:append_text(string.format(", %d bytes that start no record (skipped)", n))
    infos[#infos + 1] = "[no record start]"
end

-- HTTP on a flodl port: the controller's port mux serves GET /status (and POST) beside the data
-- channel. A connection whose first bytes are such a request (or the responder's "HTTP/" reply)
-- is handed to Wireshark's HTTP dissector, not shown as malformed flodl records.
local function http_start(tvb)
    if tvb:len() < 4 then return false end
    local m = u32(tvb, 0)
    if m == C.CHANNEL_MAGIC_HTTP_GET or m == C.CHANNEL_MAGIC_HTTP_POST then return true end
    return tvb:len() >= 5 and tvb(0, 5):string() == "HTTP/"
end

local http_dissector = false  -- not looked up yet; nil when Wireshark has none

-- The length of the HTTP message at off (headers, then a Content-Length body), or nil while its
-- headers are not whole. A dissector called from Lua cannot ask TCP for more bytes, so the
-- messages are framed here and each is handed over whole.
local HTTP_HEAD_MAX = 65536
local function http_message_len(tvb, off)
    local text = tvb:raw(off, math.min(tvb:len() - off, HTTP_HEAD_MAX))
    local head_end = text:find("\r\n\r\n", 1, true)
    if not head_end then return nil end
    local body = text:sub(1, head_end + 1):lower():match("\r\ncontent%-length:[ \t]*(%d+)")
    return head_end + 3 + (tonumber(body) or 0)
end

local function dissect_http(tvb, pinfo, tree)
    if http_dissector == false then
        local ok, d = pcall(Dissector.get, "http")
        http_dissector = ok and d or nil
    end
    local len = tvb:len()
    if not http_dissector then return len end
    local off = 0
    while off < len do
        local n = http_message_len(tvb, off)
        if n == nil or off + n > len then
            local framed = n ~= nil or len - off < HTTP_HEAD_MAX
            if pinfo.can_desegment > 0 and framed then
                pinfo.desegment_offset = off
                pinfo.desegment_len = n and (off + n - len) or DESEGMENT_ONE_MORE_SEGMENT
                return len
            end
            n = len - off  -- no reassembly (or no end of headers in sight): hand the rest over
        end
        local ok = pcall(http_dissector.call, http_dissector, tvb(off, n):tvb(), pinfo, tree)
        if not ok then
            tree:add(proto, tvb(off, n))
                :append_text(", an HTTP message the HTTP dissector could not read")
        end
        off = off + n
    end
    return len
end

-- (a local function: the heuristic calls it directly, since calling proto.dissector from Lua goes
-- through Wireshark's dissector call, which takes the right to ask for reassembly away)
local function dissect(tvb, pinfo, tree)
    local len = tvb:len()
    if len == 0 then return 0 end
    -- a packet seen again that its first pass did not hand here: one the heuristic refused
    -- before it claimed the connection (its dissector then applies from the connection's start)
    if pinfo.visited and not frame_conv[pinfo.number] then return 0 end
    continuing, uncaptured = nil, nil
    local conv = conv_of(pinfo)
    local going_on = conv.dirs and conv.dirs[direction_key(pinfo)]
    going_on = going_on and (going_on.pend or going_on.head)
    if not pinfo.visited and (conv.http or conv.flodl) and len >= 4 and not going_on then
        -- a flodl record's start where HTTP was, or HTTP where flodl was: the ports were reused
        -- by a new connection (what a pass without tcp.stream cannot tell otherwise)
        local now_http = http_start(tvb)
        if (conv.http and not now_http and START[u32(tvb, 0)]) or (conv.flodl and now_http) then
            conv = conv_afresh(pinfo)
        end
    end
    if conv.http == nil and not conv.flodl and not pinfo.visited then
        conv.http = http_start(tvb) or nil  -- judged once, on a connection's first bytes
    end
    if conv.http then return dissect_http(tvb, pinfo, tree) end
    if not pinfo.visited then conv.flodl = true end
    -- the segment's length on the wire: above len when the capture cut the packet (its snaplen);
    -- the bytes past len are not in the capture, and the records they hold cannot be shown
    local wire = math.max(tvb:reported_len(), len)
    local s = segment_start(pinfo, conv, len, wire)
    local infos = {}
    local off = 0
    if s.pend then off = add_continuation(tvb, tree, s, infos, wire) end
    if s.head then off = complete_head(tvb, pinfo, tree, conv, s, infos, wire) end
    while off < len do
        local name, n, why, grp = frame_pdu(tvb, off, conv, s.sync)
        if name == nil and pinfo.can_desegment > 0 then
            pinfo.desegment_offset = off
            pinfo.desegment_len = n
            s.asked = { head = s.sync and tvb:raw(off, len - off), at = segment_next_seq(tvb) }
            break
        elseif not name and not s.sync
            and not (name == nil and len - off >= 4 and START[u32(tvb, off)]) then
            if name == nil and wire == len then  -- (no reassembly) too few bytes to tell
                add_maybe_head(tvb(off), tree, s, infos, "")
            else
                add_skipped(tvb, off, tree, s, infos)
            end
            break
        elseif name == nil and wire > len then
            -- the header is cut by the capture, not by the segment's end
            add_uncaptured_head(tvb(off), tree, s, infos)
            break
        elseif name == nil then
            -- no reassembly: the header (begun in sync, or with a record's magic) is completed
            -- from the next segment's bytes
            add_head(tvb(off), tree, s, infos, "")
            s.sync, s.quiet = true, nil
            break
        elseif name == false then
            add_malformed(tvb(off), tree, grp, why, infos)
            s.sync, s.quiet = false, true
            break
        elseif FIXED[name] and n > len - off and wire == len and pinfo.can_desegment == 0 then
            -- no reassembly: a channel magic, handshake or ack cut by the segment's end is kept
            -- as a cut header is, and dissected whole from the next segment's bytes (its fields
            -- tell the connection's rank and which end is the rank's)
            add_head(tvb(off), tree, s, infos, "")
            s.sync, s.quiet = true, nil
            break
        end
        s.sync, s.quiet = true, nil
        local have = math.min(n, len - off)
        local onwire = math.min(n, wire - off)  -- its bytes in this segment, captured or not
        if why then
            -- a length above the ceiling: the header is reported, the record's bytes skipped (no
            -- reassembly is asked for); those in the next segments are its continuation
            add_malformed(tvb(off, have), tree, grp, why, infos)
        elseif have < n and pinfo.can_desegment > 0 then
            pinfo.desegment_offset = off
            pinfo.desegment_len = off + n - len
            local nxt = segment_next_seq(tvb)
            s.asked = { pend = { kind = record_kind(tvb, off, name), total = n, done = len - off },
                        stop = nxt and (nxt + off + n - len) % SEQ_MOD }
            break
        else
            -- without reassembly, a record going on past the segment is continued in the next;
            -- one going on past the packet's captured bytes is cut by the capture
            if have < onwire then uncaptured = n elseif have < n then continuing = n end
            infos[#infos + 1] = REC[name](tvb(off, have):tvb(), pinfo, tree, conv)
            continuing, uncaptured = nil, nil
        end
        if onwire < n then
            s.pend = { kind = record_kind(tvb, off, name), total = n, done = onwire }
        end
        off = off + onwire
    end
    if wire > len then
        -- bytes not captured after the last record read: where the next record starts is not
        -- known, unless the segment ends inside a record of known length
        if off < wire and not s.pend then s.sync, s.quiet, s.head = false, true, nil end
        add_uncaptured(tvb, pinfo, tree, conv, infos, wire)
    end
    if s.dir then segment_end(s, wire) end
    if #infos > 0 then
        -- TCP may call the dissector twice for one packet (a reassembled record, then the rest)
        local text = table.concat(infos, " | ")
        if tostring(pinfo.cols.protocol) == SPEC.proto.name then
            pinfo.cols.info:append(" | " .. text)
        else
            pinfo.cols.protocol = SPEC.proto.name
            pinfo.cols.info = text
        end
    end
    return len
end

proto.dissector = dissect

-- Registration ----------------------------------------------------------------------------------
local function heuristic(tvb, pinfo, tree)
    local len = tvb:len()
    if len < 4 then return false end
    local m = u32(tvb, 0)
    local ok = START[m] ~= nil
    if not ok and len >= 8 then
        ok = u32(tvb, 4) == C.ROUND_FRAME_MAGIC and m <= proto.prefs.ceiling
    end
    if not ok then return false end
    pinfo.conversation = proto
    dissect(tvb, pinfo, tree)
    return true
end
proto:register_heuristic("tcp", heuristic)

local tcp_port = DissectorTable.get("tcp.port")
local registered_ports = ""
local function register_ports()
    if registered_ports ~= "" then tcp_port:remove(registered_ports, proto) end
    registered_ports = tostring(proto.prefs.ports)
    if registered_ports ~= "" then tcp_port:add(registered_ports, proto) end
end
function proto.prefs_changed() register_ports() end
register_ports()
tcp_port:add_for_decode_as(proto)
